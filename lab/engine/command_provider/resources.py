"""The resources: ``command:remote:Command`` (complete) and ``command:local:Command`` (no
assetPaths/archivePaths), with the lifecycle pulumi-command 1.2.1 documents (its Python SDK's
docstrings for every input, and https://www.pulumi.com/registry/packages/command/api-docs/):

- Check: inputs decode into the input type (unknown fields and wrong types are check failures);
  schema defaults are filled in (connection.user "root", port 22, dialErrorLimit 10,
  perDialTimeout 15, proxy the same; addPreviousOutputInEnv true); every field the schema marks
  secret is made secret where it stands (``connection``, and inside it ``password``,
  ``privateKey``, ``privateKeyPassword``, the proxy's too), so the state holds the key as a
  secret nested in the secret connection, as the real provider's does.
- Diff: old state's input keys vs new inputs; a change anywhere is an in-place update, except
  ``triggers`` (replaceOnChanges) which is a replace; deleteBeforeReplace is left to the program.
- Create: id = name + 8 hex; preview runs nothing and returns stdout/stderr unknown; no
  ``create`` = nothing runs, stdout = stderr = "".
- Update: runs ``update``, else ``create``, with the NEW inputs (connection included); the previous
  stdout/stderr are kept when neither is set; preview runs nothing (stdout/stderr unknown).
- Delete: runs the ``delete`` stored in state, with the state's connection/environment/stdin.
- Read (refresh): returns the stored state unchanged.
- Outputs = the inputs (each keeping its secret bit, as infer's default secret flow does) +
  stdout/stderr (not secret unless the program asks with additional_secret_outputs).
- Errors: ``<exit error>: running "<cmd>":\\n<stdout+stderr>`` (the command is shown as
  ``[secret]`` when the program passed it as a secret: the one deliberate difference).
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import process, ssh
from .props import COMPUTED, SIG, DiffResult, Secret, diff_inputs, go_quote, is_secret, reveal

LOGGING = ("stdout", "stderr", "stdoutAndStderr", "none")


class ResourceError(Exception):
    """Reported to the engine as the operation's error (the resource op fails)."""


@dataclass
class Failure:
    property: str
    reason: str


@dataclass
class Context:
    """What an operation may use besides its inputs."""

    log_status: Callable[[str], None]  # ephemeral info line for this resource (InfoStatus)
    cancelled: threading.Event
    on_start: Callable[[subprocess.Popen[bytes]], None] | None = None


# --- input schema (the parts Check needs) ----------------------------------------------------------
@dataclass
class Field:
    kind: str  # "string", "number", "integer", "boolean", "array", "map", "object", "enum"
    default: Any = None
    required: bool = False
    fields: dict[str, Field] = field(default_factory=dict)  # for "object"
    values: tuple[str, ...] = ()  # for "enum"
    secret: bool = False  # the schema's "secret": true (the provider's `provider:"secret"` tag)


def _conn_fields(proxy: bool) -> dict[str, Field]:
    f = {
        "host": Field("string", required=True),
        "port": Field("number", default=22),
        "user": Field("string", default="root"),
        "password": Field("string", secret=True),
        "privateKey": Field("string", secret=True),
        "privateKeyPassword": Field("string", secret=True),
        "agentSocketPath": Field("string"),
        "dialErrorLimit": Field("integer", default=ssh.DEFAULT_DIAL_ERROR_LIMIT),
        "perDialTimeout": Field("integer", default=ssh.DEFAULT_PER_DIAL_TIMEOUT),
        "hostKey": Field("string"),
    }
    if not proxy:
        f["proxy"] = Field("object", fields=_conn_fields(True))
    return f


COMMON = {
    "triggers": Field("array"),
    "create": Field("string"),
    "update": Field("string"),
    "delete": Field("string"),
    "stdin": Field("string"),
    "logging": Field("enum", values=LOGGING),
    "environment": Field("map"),
    "addPreviousOutputInEnv": Field("boolean", default=True),
}
REMOTE_INPUTS = {**COMMON, "connection": Field("object", required=True, secret=True,
                                               fields=_conn_fields(False))}
LOCAL_INPUTS = {**COMMON, "dir": Field("string"), "interpreter": Field("array"),
                "assetPaths": Field("array"), "archivePaths": Field("array")}


def _type_ok(f: Field, v: Any) -> bool:
    if v is COMPUTED or isinstance(v, dict) and SIG in v:
        return True
    match f.kind:
        case "string":
            return isinstance(v, str)
        case "enum":
            return isinstance(v, str) and v in f.values
        case "number":
            return isinstance(v, int | float) and not isinstance(v, bool)
        case "integer":
            return isinstance(v, int) and not isinstance(v, bool)
        case "boolean":
            return isinstance(v, bool)
        case "array":
            return isinstance(v, list)
        case "map":
            return isinstance(v, dict) and all(
                e is COMPUTED or isinstance(reveal(e), str) for e in v.values())
        case "object":
            return isinstance(v, dict)
    return False


def _check_object(fields: Mapping[str, Field], obj: dict[str, Any], type_name: str, top: str,
                  failures: list[Failure]) -> dict[str, Any]:
    """Validate + fill defaults; secrets and unknowns are kept where they are."""
    out: dict[str, Any] = {}
    for k, v in obj.items():
        f = fields.get(k)
        if f is None:
            failures.append(Failure(top or k, f"Unrecognized field '{k}' on '{type_name}'"))
            continue
        plain = v.value if isinstance(v, Secret) else v
        if not _type_ok(f, plain):
            why = (f"must be one of {', '.join(f.values)}" if f.kind == "enum"
                   else f"expected {f.kind}")
            failures.append(Failure(top or k, f"'{type_name}.{k}': {why}"))
            continue
        if f.kind == "object" and isinstance(plain, dict) and SIG not in plain:
            sub = _check_object(f.fields, plain, f"{type_name}.{k}", top or k, failures)
            out[k] = Secret(sub) if isinstance(v, Secret) else sub
        else:
            out[k] = v
    for k, f in fields.items():
        if k in out:
            continue
        if f.required:
            failures.append(Failure(top or k, f"Missing required field '{k}' on '{type_name}'"))
        elif f.default is not None:
            out[k] = f.default
    return out


def apply_secrets(fields: Mapping[str, Field], obj: Any) -> Any:
    """Every field the schema marks secret made secret where it stands, at any depth, secrets
    and unknowns already there kept: what Check returns, the real provider's inputs and so its
    state (pulumi-go-provider v1.3.0 ``infer/apply_secrets.go``, applied to Check's result
    whether or not it failed; the fields' tags: the provider's schema, ``"secret": true``)."""
    if isinstance(obj, Secret):
        return Secret(apply_secrets(fields, obj.value))
    if not isinstance(obj, dict) or SIG in obj:
        return obj
    out = dict(obj)
    for k, f in fields.items():
        if k not in out:
            continue
        v = apply_secrets(f.fields, out[k]) if f.kind == "object" else out[k]
        out[k] = Secret(v) if f.secret and not isinstance(v, Secret) else v
    return out


# --- shared lifecycle --------------------------------------------------------------------------------
def _unique_id(name: str) -> str:
    return name + secrets.token_hex(4)


def _logging_flags(v: Any) -> tuple[bool, bool]:
    mode = reveal(v) if v is not None else None
    if mode is None:
        return True, True
    return mode in ("stdout", "stdoutAndStderr"), mode in ("stderr", "stdoutAndStderr")


def _env(inputs: Mapping[str, Any], prev_stdout: str, prev_stderr: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for k, v in (reveal(inputs.get("environment")) or {}).items():
        env[k] = str(v)
    if reveal(inputs.get("addPreviousOutputInEnv")) is not False:
        if prev_stdout:
            env["PULUMI_COMMAND_STDOUT"] = prev_stdout
        if prev_stderr:
            env["PULUMI_COMMAND_STDERR"] = prev_stderr
    return env


def _shown(inputs: Mapping[str, Any], key: str, cmd: str) -> str:
    return "[secret]" if is_secret(inputs.get(key)) else go_quote(cmd)


class Resource:
    TOKEN = ""
    INPUTS: Mapping[str, Field] = {}
    TYPE_NAME = ""

    # -- to implement
    def _run(self, inputs: Mapping[str, Any], key: str, prev: tuple[str, str],
             ctx: Context) -> tuple[str, str]:
        raise NotImplementedError

    # -- CRUD
    def check(self, news: dict[str, Any]) -> tuple[dict[str, Any], list[Failure]]:
        failures: list[Failure] = []
        checked = _check_object(self.INPUTS, news, self.TYPE_NAME, "", failures)
        return apply_secrets(self.INPUTS, news if failures else checked), failures

    def diff(self, old_state: Mapping[str, Any], news: Mapping[str, Any],
             ignore_changes: list[str]) -> DiffResult:
        return diff_inputs(old_state, news, self.INPUTS.keys(), ["triggers"], ignore_changes)

    def create(self, name: str, inputs: dict[str, Any], preview: bool,
               ctx: Context) -> tuple[str, dict[str, Any]]:
        rid = _unique_id(name)
        if preview:
            return rid, {**inputs, "stdout": COMPUTED, "stderr": COMPUTED}
        out, err = "", ""
        if inputs.get("create") is not None:
            out, err = self._run(inputs, "create", ("", ""), ctx)
        return rid, {**inputs, "stdout": out, "stderr": err}

    def update(self, old_state: Mapping[str, Any], news: dict[str, Any], preview: bool,
               ctx: Context) -> dict[str, Any]:
        prev = (str(reveal(old_state.get("stdout", "")) or ""),
                str(reveal(old_state.get("stderr", "")) or ""))
        if preview:
            return {**news, "stdout": COMPUTED, "stderr": COMPUTED}
        out, err = prev
        if news.get("update") is not None:
            out, err = self._run(news, "update", prev, ctx)
        elif news.get("create") is not None:
            out, err = self._run(news, "create", prev, ctx)
        return {**news, "stdout": out, "stderr": err}

    def delete(self, state: Mapping[str, Any], ctx: Context) -> None:
        if state.get("delete") is None:
            return
        prev = (str(reveal(state.get("stdout", "")) or ""),
                str(reveal(state.get("stderr", "")) or ""))
        self._run(state, "delete", prev, ctx)


class RemoteCommand(Resource):
    TOKEN = "command:remote:Command"
    INPUTS = REMOTE_INPUTS
    TYPE_NAME = "remote.CommandInputs"

    def _run(self, inputs: Mapping[str, Any], key: str, prev: tuple[str, str],
             ctx: Context) -> tuple[str, str]:
        cmd = str(reveal(inputs[key]))
        log_out, log_err = _logging_flags(inputs.get("logging"))
        stdin = reveal(inputs.get("stdin"))
        try:
            conn = ssh.parse_connection(reveal(inputs.get("connection")))
            return ssh.run(conn, cmd, env_vars=_env(inputs, *prev),
                           stdin=stdin if isinstance(stdin, str) else None,
                           stdout_sink=ctx.log_status if log_out else None,
                           stderr_sink=ctx.log_status if log_err else None,
                           status=ctx.log_status, cancelled=ctx.cancelled, on_start=ctx.on_start)
        except (ssh.InputError, ssh.DialError) as e:
            raise ResourceError(str(e)) from None
        except ssh.CommandError as e:
            why, combined = e.args
            raise ResourceError(f"{why}: running {_shown(inputs, key, cmd)}:\n{combined}") \
                from None


class LocalCommand(Resource):
    TOKEN = "command:local:Command"
    INPUTS = LOCAL_INPUTS
    TYPE_NAME = "local.CommandInputs"

    def check(self, news: dict[str, Any]) -> tuple[dict[str, Any], list[Failure]]:
        inputs, failures = super().check(news)
        for k in ("assetPaths", "archivePaths"):
            if news.get(k) is not None:
                failures.append(Failure(k, f"'{k}' is not supported by the pulumi-command "
                                           "stand-in (lab/engine/command_provider)"))
        return inputs, failures

    def _run(self, inputs: Mapping[str, Any], key: str, prev: tuple[str, str],
             ctx: Context) -> tuple[str, str]:
        cmd = str(reveal(inputs[key]))
        interp = reveal(inputs.get("interpreter")) or ["/bin/sh", "-c"]
        argv = [str(a) for a in interp] + [cmd]
        cwd = reveal(inputs.get("dir")) or os.getcwd()
        exe = shutil.which(argv[0])
        if exe is None:
            raise ResourceError(f'exec: "{argv[0]}": executable file not found in $PATH: '
                                f"running {_shown(inputs, key, cmd)}:\n")
        env = dict(os.environ)
        env.update(_env(inputs, *prev))
        log_out, log_err = _logging_flags(inputs.get("logging"))
        stdin = reveal(inputs.get("stdin"))
        try:
            done = process.run([exe, *argv[1:]], env=env,
                               stdin=stdin if isinstance(stdin, str) else None,
                               stdout_sink=ctx.log_status if log_out else None,
                               stderr_sink=ctx.log_status if log_err else None, cwd=str(cwd),
                               on_start=ctx.on_start)
        except OSError as e:
            raise ResourceError(f"{e}: running {_shown(inputs, key, cmd)}:\n") from None
        if done.returncode != 0:
            why = (f"exit status {done.returncode}" if done.returncode > 0
                   else f"signal: {-done.returncode}")
            raise ResourceError(f"{why}: running {_shown(inputs, key, cmd)}:\n{done.combined}")
        return done.stdout.removesuffix("\n"), done.stderr.removesuffix("\n")


RESOURCES: dict[str, Resource] = {r.TOKEN: r for r in (RemoteCommand(), LocalCommand())}
