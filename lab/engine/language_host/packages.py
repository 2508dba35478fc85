"""Which Pulumi packages (resource plugins) a Python program needs, as the real host decides it
for GetRequiredPackages: every installed distribution that ships a `pulumi-plugin.json` in its
module directory, or whose name starts with `pulumi-`/`pulumi_` (first-party convention), minus
the packages known to have no plugin. pulumi-command 1.2.1 for instance ships
`pulumi_command/pulumi-plugin.json` = {"resource": true, "name": "command", "version": "1.2.1"}.
"""

from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass
from typing import Any

from .toolchain import Package

# Known to have no plugin (and no pulumi-plugin.json saying so), both spellings.
PACKAGES_WITHOUT_PLUGINS = {"pulumi-policy", "pulumi_policy", "pulumi-esc-sdk", "pulumi_esc_sdk"}


@dataclass
class Parameterization:
    name: str
    version: str
    value: bytes


@dataclass
class PackageDependency:
    name: str
    version: str  # "v1.2.1"
    kind: str = "resource"
    server: str = ""
    parameterization: Parameterization | None = None
    extension: Parameterization | None = None


def read_plugin_json(pkg: Package) -> dict[str, Any] | None:
    """`<location>/<module>/pulumi-plugin.json`, module = the package name with - -> _."""
    if not pkg.location:
        return None
    path = os.path.join(pkg.location, pkg.name.replace("-", "_"), "pulumi-plugin.json")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a JSON object")
    return data


def is_pulumi_package(pkg: Package) -> bool:
    if read_plugin_json(pkg) is not None:
        return True
    return pkg.name.startswith(("pulumi_", "pulumi-"))


def plugin_version(package_version: str) -> str:
    """`determinePluginVersion`: a PEP 440 version as a plugin (semver) version.

    1.0 -> 1.0.0, 1.2.3a4 -> 1.2.3-alpha.4, 1.2.3b4 -> 1.2.3-beta.4, 1.2.3rc4 -> 1.2.3-rc.4,
    1.2.3.post4 -> 1.2.3+post4, 1.2.3.dev5 -> 1.2.3+dev5, 1.2.3.post4.dev5 -> 1.2.3+post4dev5.
    Epochs and anything else raise ValueError (the real host then skips the package)."""
    if not package_version:
        raise ValueError("cannot parse empty string")
    if not package_version.isascii():
        raise ValueError("not ascii")

    def number(s: str) -> tuple[str, str]:
        i = 0
        while i < len(s) and s[i].isdigit():
            i += 1
        return s[:i], s[i:]

    n, rest = number(package_version)
    if n and rest.startswith("!"):
        raise ValueError("epochs are not supported")
    segments: list[str] = []
    rest = package_version
    found_dot = False
    while True:
        n, rest = number(rest)
        if not n:
            break
        found_dot = False
        segments.append(n)
        if rest.startswith("."):
            rest = rest[1:]
            found_dot = True
        else:
            break
    if found_dot:
        rest = "." + rest
    while len(segments) < 3:
        segments.append("0")
    if not rest:
        return ".".join(segments)
    pre = ""
    if rest.startswith("a"):
        n, rest = number(rest[1:])
        pre = "-alpha." + n
    elif rest.startswith("b"):
        n, rest = number(rest[1:])
        pre = "-beta." + n
    elif rest.startswith("rc"):
        n, rest = number(rest[2:])
        pre = "-rc." + n
    post = ""
    if rest.startswith(".post"):
        n, rest = number(rest[5:])
        post = "+post" + n
    dev = ""
    if rest.startswith(".dev"):
        n, rest = number(rest[4:])
        dev = ("" if post else "+") + "dev" + n
    if rest:
        raise ValueError(f"'{rest}' still unparsed")
    return ".".join(segments) + pre + post + dev


def _parameterization(raw: Any) -> Parameterization | None:
    if not isinstance(raw, dict):
        return None
    value = raw.get("value") or ""
    # Go's []byte fields are base64 in JSON
    return Parameterization(str(raw.get("name", "")), str(raw.get("version", "")),
                            base64.b64decode(value) if isinstance(value, str) else b"")


def package_dependency(pkg: Package) -> PackageDependency | None:
    """`determinePackageDependency`: None if the package has no plugin or its version cannot
    be derived."""
    name = version = server = ""
    param = ext = None
    data = read_plugin_json(pkg)
    if data is not None:
        if not data.get("resource", False):
            return None
        name = str(data.get("name") or "")
        version = str(data.get("version") or "")
        server = str(data.get("server") or "")
        param = _parameterization(data.get("parameterization"))
        ext = _parameterization(data.get("extensionParameterization"))
    if not name:
        name = pkg.name.removeprefix("pulumi-")
    if not version:
        try:
            version = plugin_version(pkg.version)
        except ValueError:
            return None
    if not version.startswith("v"):
        version = "v" + version
    return PackageDependency(name=name, version=version, server=server, parameterization=param,
                             extension=ext)


def required_packages(installed: list[Package]) -> list[PackageDependency]:
    deps = []
    for pkg in installed:
        if not is_pulumi_package(pkg) or pkg.name in PACKAGES_WITHOUT_PLUGINS:
            continue
        dep = package_dependency(pkg)
        if dep is not None:
            deps.append(dep)
    return deps
