"""A reduced Pulumi package schema for the stand-in (GetSchema): the two Command resources and
their types, with the real provider's defaults, secrets and replaceOnChanges. Enough for tools
that ask the engine for a schema; the program itself uses the pre-generated pulumi_command SDK.
"""

from __future__ import annotations

import json
from typing import Any

from . import VERSION


def _s(desc: str, **kw: Any) -> dict[str, Any]:
    return {"type": "string", "description": desc, **kw}


_CONN_COMMON: dict[str, Any] = {
    "host": _s("The address of the resource to connect to."),
    "port": {"type": "number", "default": 22, "description": "The port to connect to."},
    "user": _s("The user that we should use for the connection.", default="root"),
    "password": _s("The password we should use for the connection.", secret=True),
    "privateKey": _s("The contents of an SSH key to use for the connection.", secret=True),
    "privateKeyPassword": _s("The password to use in case the private key is encrypted.",
                             secret=True),
    "agentSocketPath": _s("SSH Agent socket path. Default to environment variable "
                          "SSH_AUTH_SOCK if present."),
    "dialErrorLimit": {"type": "integer", "default": 10,
                       "description": "Max allowed errors on trying to dial the remote host. "
                                      "-1 set count to unlimited. Default value is 10."},
    "perDialTimeout": {"type": "integer", "default": 15,
                       "description": "Max number of seconds for each dial attempt. 0 implies "
                                      "no maximum. Default value is 15 seconds."},
    "hostKey": _s("The expected host key to verify the server's identity. If not provided, "
                  "the host key will be ignored."),
}

_COMMON_INPUTS: dict[str, Any] = {
    "triggers": {"type": "array", "items": {"$ref": "pulumi.json#/Any"},
                 "replaceOnChanges": True,
                 "description": "Trigger a resource replacement on changes to any of these "
                                "values."},
    "create": _s("The command to run on create."),
    "update": _s("The command to run on update, if empty, create will run again."),
    "delete": _s("The command to run on delete."),
    "stdin": _s("Pass a string to the command's process as standard in"),
    "logging": {"$ref": "#/types/command:{mod}:Logging"},
    "environment": {"type": "object", "additionalProperties": {"type": "string"}},
    "addPreviousOutputInEnv": {"type": "boolean", "default": True},
}


def _logging(mod: str) -> dict[str, Any]:
    return {"type": "string", "enum": [
        {"name": "stdout", "value": "stdout"}, {"name": "stderr", "value": "stderr"},
        {"name": "stdoutAndStderr", "value": "stdoutAndStderr"},
        {"name": "none", "value": "none"}]}


def _inputs(mod: str, extra: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(json.dumps(_COMMON_INPUTS).replace("{mod}", mod))
    out.update(extra)
    return out


def schema() -> dict[str, Any]:
    remote_in = _inputs("remote", {"connection": {
        "$ref": "#/types/command:remote:Connection", "secret": True,
        "description": "The parameters with which to connect to the remote host."}})
    local_in = _inputs("local", {
        "dir": _s("The directory from which to run the command from."),
        "interpreter": {"type": "array", "items": {"type": "string"}},
        "assetPaths": {"type": "array", "items": {"type": "string"}},
        "archivePaths": {"type": "array", "items": {"type": "string"}},
    })
    outs = {"stdout": _s("The standard output of the command's process"),
            "stderr": _s("The standard error of the command's process")}
    return {
        "name": "command",
        "version": VERSION,
        "displayName": "Command",
        "description": "STAND-IN for the Pulumi Command provider (spark-vllm "
                       "lab/engine/command_provider): command:remote:Command and "
                       "command:local:Command.",
        "types": {
            "command:remote:Connection": {"type": "object", "required": ["host"], "properties": {
                **_CONN_COMMON, "proxy": {"$ref": "#/types/command:remote:ProxyConnection"}}},
            "command:remote:ProxyConnection": {"type": "object", "required": ["host"],
                                               "properties": dict(_CONN_COMMON)},
            "command:remote:Logging": _logging("remote"),
            "command:local:Logging": _logging("local"),
        },
        "resources": {
            "command:remote:Command": {
                "description": "A command to run on a remote host. The connection is "
                               "established via ssh.",
                "inputProperties": remote_in, "requiredInputs": ["connection"],
                "properties": {**remote_in, **outs}, "required": ["connection", "stdout",
                                                                  "stderr"]},
            "command:local:Command": {
                "description": "A local command to be executed.",
                "inputProperties": local_in,
                "properties": {**local_in, **outs}, "required": ["stdout", "stderr"]},
        },
    }


def schema_json() -> str:
    return json.dumps(schema())
