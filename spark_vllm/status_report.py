"""What `spark-vllm status` reads (spark_vllm/status.py): the stack's outputs and the nodes now,
one SSH session per node (each container's state and image, the image under the stack's tag,
the compile cache's size, Ray's node table on the head), vLLM's liveness check and the endpoint
from here, into a Report with its verdict and its text."""

from __future__ import annotations

import json
import shlex
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from . import errors
from .components import node_memory, ssh
from .components.render import commands, liveness_commands
from .components.secret_check import NAMESPACE

_INSPECT = ("docker inspect --format "
            "'{{.Name}}|{{.Id}}|{{.State.Status}}|{{.State.ExitCode}}|{{.State.StartedAt}}|"
            "{{.Image}}' ")


_RAY_NODES_PY = (
    "import json, ray\n"
    "ray.init(address='auto', logging_level='ERROR', log_to_driver=False)\n"
    "print(json.dumps([{'ip': n['NodeManagerAddress'], 'gpus': n['Resources'].get('GPU', 0)}\n"
    "                  for n in ray.nodes() if n['Alive']]))\n"
)


@dataclass
class ContainerView:
    node: str
    role: str
    name: str
    state: str  # running, exited (137), gone, …
    id: str = ""
    expected_id: str = ""
    image: str = ""  # the image id it runs

    @property
    def ok(self) -> bool:
        return self.state == "running"

    def describe(self) -> str:
        # An interrupted `pulumi up` keeps the stack's previous outputs: the next run updates
        # them. A container started by hand under the stack's name shows the same way.
        if self.state == "running" and self.expected_id and self.id != self.expected_id:
            return f"running ({self.id[:12]}; the outputs say {self.expected_id[:12]})"
        return self.state


@dataclass
class ModelView:
    """One served model of a stack with several (`models:`): its API server's liveness."""

    key: str
    served: str
    node: dict[str, Any] = field(repr=False)  # its first node, which runs its API server
    container: str = ""
    state: str = "unknown"
    seen: str = ""
    utilization: float = node_memory.DEFAULT_UTILIZATION
    nodes: list[str] = field(default_factory=list)
    check: list[str] = field(default_factory=list)  # its liveness read's argv
    endpoint: str = ""  # its own vLLM's (…/v1), which `top` reads /metrics from

    @property
    def ok(self) -> bool:
        return self.state in ("serving", "busy")


@dataclass
class Report:
    stack: str
    endpoint: str
    model: str
    containers: list[ContainerView] = field(default_factory=list)
    ray: dict[str, str] = field(default_factory=dict)  # node -> "alive, 1 GPU" / why not
    ray_ok: bool = False
    vllm: str = ""  # what the liveness check saw
    vllm_state: str = "unknown"  # serving | busy | wedged | not serving | dead | unknown
    endpoint_check: str = ""  # /health from this machine
    endpoint_ok: bool = False
    unreachable: dict[str, str] = field(default_factory=dict)
    compile_cache: dict[str, str] = field(default_factory=dict)  # node -> "123 MiB in DIR"
    # the stack's image (its id as the last `up` checked it) against what each node runs and
    # holds under its tag now: node -> why it differs
    image: str = ""
    image_mismatch: dict[str, str] = field(default_factory=dict)
    # what collect read once, for a repair's steps (never printed)
    nodes: list[dict[str, Any]] = field(default_factory=list, repr=False)
    key: str = field(default="", repr=False)
    gpu_memory_utilization: float = node_memory.DEFAULT_UTILIZATION
    models: list[ModelView] = field(default_factory=list)  # several models: each one's

    @property
    def vllm_ok(self) -> bool:
        if self.models:
            return all(m.ok for m in self.models)
        return self.vllm_state in ("serving", "busy")

    @property
    def nodes_ok(self) -> bool:
        """Everything on the nodes is as it should be (what a repair could change)."""
        return (not self.unreachable and self.ray_ok and self.vllm_ok
                and all(c.ok for c in self.containers))

    @property
    def serving(self) -> bool:
        return self.nodes_ok and self.endpoint_ok

    def problems(self) -> list[str]:
        out = [f"{n}: unreachable ({why})" for n, why in self.unreachable.items()]
        out += [f"{c.node} {c.role}: {c.describe()}" for c in self.containers if not c.ok]
        out += [f"{n}: Ray: {v}" for n, v in self.ray.items() if not v.startswith("alive")]
        if self.models:
            out += [f"model {m.key}: vLLM {m.state}: {m.seen}" for m in self.models if not m.ok]
        elif not self.vllm_ok:
            out.append(f"vLLM {self.vllm_state}: {self.vllm}")
        if not self.endpoint_ok:
            out.append(f"endpoint from here: {self.endpoint_check}")
        out += [f"{n}: image: {why}" for n, why in self.image_mismatch.items()]
        return out

    def to_json(self) -> dict[str, Any]:
        return {"stack": self.stack, "serving": self.serving, "endpoint": self.endpoint,
                "containers": [{"node": c.node, "role": c.role, "name": c.name,
                                "state": c.describe(), "ok": c.ok} for c in self.containers],
                "ray": self.ray, "vllm": {"state": self.vllm_state, "seen": self.vllm},
                **({"models": {m.key: {"servedModelName": m.served, "state": m.state,
                                       "seen": m.seen, "ok": m.ok, "nodes": m.nodes}
                               for m in self.models}} if self.models else {}),
                "endpointCheck": self.endpoint_check, "unreachable": self.unreachable,
                "compileCache": self.compile_cache,
                "image": {"id": self.image, "mismatch": self.image_mismatch},
                "problems": self.problems()}

    def text(self) -> str:
        lines = [f"stack {self.stack}: {self.endpoint} (model {self.model})",
                 f"{'NODE':<12}{'CONTAINER':<12}{'STATE':<40}RAY"]
        for c in self.containers:
            ray = self.ray.get(c.node, "") if c.role not in (commands.VLLM, commands.LEADER) else ""
            lines.append(f"{c.node:<12}{c.role:<12}{c.describe():<40}{ray}")
        for node, why in self.unreachable.items():
            lines.append(f"{node:<12}{'-':<12}{'UNREACHABLE: ' + why}")
        for node, use in self.compile_cache.items():
            lines.append(f"{node:<12}{'cache':<12}{use}")
        for node, why in self.image_mismatch.items():
            lines.append(f"{node:<12}{'image':<12}MISMATCH: {why}")
        if self.models:
            lines += [f"model {m.key} ({m.served}, on {', '.join(m.nodes)}): {m.state}: {m.seen}"
                      for m in self.models]
        else:
            lines.append(f"vLLM: {self.vllm_state}: {self.vllm}")
        lines.append(f"endpoint from here: {self.endpoint_check}")
        if self.serving:
            lines.append("verdict: SERVING")
            if self.image_mismatch:
                lines.append("image: a node does not hold the stack's image: its next container "
                             "start runs another. With imageStaging copy, pulumi up --refresh "
                             f"--stack {self.stack} copies the head's again; else put the "
                             "image back there")
        else:
            lines.append("verdict: NOT SERVING: " + "; ".join(self.problems()))
            lines.append(f"repair: pulumi up --refresh --stack {self.stack}  "
                         "(replaces what died and what depends on it)")
        return "\n".join(lines)


def config_secret(stack: Any, key: str) -> str | None:
    from pulumi import automation as auto

    try:
        value = str(stack.get_config(f"{NAMESPACE}:{key}").value)
    except auto.CommandError as err:
        # only "not found" is unset: a wrong passphrase or a backend error is said as it is
        if "not found" in str(err).lower():
            return None
        raise errors.from_pulumi(err, f"reading {NAMESPACE}:{key} of stack {stack.name}") from None
    return value or None  # "" is Pulumi.yaml's default for an unset optional secret


def api_role(head: dict[str, Any]) -> str:
    """The role of the container that serves the API on the head: vLLM (ray) or rank 0."""
    return commands.LEADER if commands.LEADER in head["containers"] else commands.VLLM


def _node_view(node: dict[str, Any], key: str, expected: dict[str, str], head: bool,
               image: str = "") -> tuple[list[ContainerView], str | None,
                                         list[dict[str, Any]] | None, str, str]:
    """The node's containers, why it cannot be reached, Ray's node table (the head), its
    compile cache's size, and the image id it holds under the stack's tag `image` now."""
    target = node_target(node, key)
    roles = node["containers"]
    script = "\n".join(
        f"{_INSPECT}{shlex.quote(name)} 2>/dev/null || echo '/{name}||gone|||'"
        for name in roles.values())
    if image:
        script += (f"\necho '---image'\ndocker image inspect --format '{{{{.Id}}}}' "
                   f"{shlex.quote(image)} 2>/dev/null || echo missing")
    cache = node.get("compileCache") or "none"
    if cache != "none":  # its size: what the node keeps for warm restarts
        script += f"\necho '---cache'\ndu -sk {shlex.quote(cache)} 2>/dev/null | cut -f1"
    if head and commands.HEAD in roles:  # backend native has no Ray to ask
        head_name = shlex.quote(roles[commands.HEAD])
        script += (f"\necho '---ray'\ntimeout 30 docker exec -i {head_name} python3 - "
                   "2>&1 <<'PY' | tail -n 1\n" + _RAY_NODES_PY + "PY\n")
    try:
        proc = ssh.run(target, script, timeout=60)
    except ssh.NodeUnreachableError as err:
        return [], str(err), None, "", ""
    text, _, ray_text = proc.stdout.partition("---ray\n")
    # the script's sections in its order: containers, ---image, ---cache (each optional)
    text, _, cache_text = text.partition("---cache\n")
    text, _, image_text = text.partition("---image\n")
    views = []
    by_name = {line.split("|")[0].lstrip("/"): line.split("|") for line in text.splitlines()
               if "|" in line}
    for role, name in roles.items():
        parts = by_name.get(name, ["", "", "gone", "", "", ""])
        cid, status, code = parts[1], parts[2], parts[3]
        state = status if status in ("running", "gone") else f"{status} ({code})"
        views.append(ContainerView(node["name"], role, name, state, cid,
                                   expected.get(f"{node['name']}/{role}", ""),
                                   parts[5] if len(parts) > 5 else ""))
    ray = None
    if head and commands.HEAD in roles:
        try:
            ray = json.loads(ray_text.strip().splitlines()[-1])
        except (ValueError, IndexError):
            ray = None
    kib = cache_text.strip()
    cache_use = ("" if cache == "none" else f"{int(kib) / 1024:.0f} MiB in {cache}"
                 if kib.isdigit() else f"empty ({cache})")
    return views, None, ray, cache_use, image_text.strip()


def image_mismatch(stack_image: str, held: str, containers: list[ContainerView]) -> str | None:
    """Why a node's image is not the stack's (its id when the last `up` checked every node):
    a container that runs another, or another image (or none) under the tag now."""
    if not stack_image:
        return None
    short = stack_image[:19]
    runs = [f"{c.role} runs {c.image[:19]}" for c in containers
            if c.state == "running" and c.image and c.image != stack_image]
    if held == "missing":
        runs.append(f"the tag holds no image (pruned?), the stack's is {short}")
    elif held and held != stack_image:
        runs.append(f"the tag holds {held[:19]}, the stack's is {short}")
    return "; ".join(runs) or None


def _ask_endpoint(endpoint: str, path: str = "/health") -> tuple[bool, str]:
    """/health through the endpoint, from this machine (what a client reaches); a gateway's
    liveness path (several models) is /health/liveliness, LiteLLM's own."""
    url = endpoint.removesuffix("/v1") + path
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status == 200, f"{url} answered {resp.status}"
    except urllib.error.HTTPError as err:
        return False, f"{url} answered {err.code}"
    except OSError as err:
        return False, f"{url}: {getattr(err, 'reason', err)}"


def classify(line: str, seen: list[str]) -> tuple[str, str]:
    """(state, what was seen) from the liveness read's state line and its stderr."""
    detail = "; ".join(seen)
    if line == "running":
        if any(s.startswith("busy:") for s in seen):
            return "busy", detail
        return "serving", detail or "running"
    if line.startswith("wedged"):
        return "wedged", line
    if line.startswith("running, not serving"):
        return "not serving", line.removeprefix("running, not serving: ")
    # exited (any code: a rank that died makes vLLM exit 0), dead, gone, created …
    return "dead", f"its container is {line or 'gone'}"


def _ask_vllm(node: dict[str, Any], key: str, check: list[str],
              name: str | None = None) -> tuple[str, str]:
    """vLLM's liveness, read on the node of its API server (the head; a served model's first
    node) as `pulumi refresh` reads it."""
    target = node_target(node, key)
    name = name or node["containers"][api_role(node)]
    try:
        proc = ssh.run(target, liveness_commands.inspect_script(name, check),
                       stdin=commands.script_text("vllm_liveness.py"),
                       timeout=liveness_commands.liveness_timeout(check) + 2 * ssh.CONNECT_TIMEOUT_S)
    except ssh.NodeUnreachableError as err:
        return "unknown", str(err)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        said = proc.stderr.strip().splitlines()
        return "unknown", said[-1] if said else f"the check ended with exit {proc.returncode}"
    seen = [ln for ln in proc.stderr.splitlines()
            if ln.startswith(("serving:", "busy:", "unknown:"))]
    return classify(lines[-1], seen)


def node_target(node: dict[str, Any], key: str) -> ssh.Target:
    """The SSH target of a node as the stack's outputs give it: what status, status --watch,
    top and bench reach every node with."""
    return ssh.Target(node=node["name"], host=node["host"], port=int(node["port"]),
                      user=node["user"], private_key=key, host_key=node.get("hostKey") or None)


def liveness_check(outputs: dict[str, Any]) -> list[str]:
    """The liveness read's argv (HOST PORT NAME CANARY_S WINDOW_S) from the `serving` output;
    a stack deployed before it existed gets the defaults for its endpoint and model."""
    serving = outputs.get("serving") or {}
    if serving.get("check"):
        return [str(v) for v in serving["check"]]
    port = outputs["endpoint"].rsplit(":", 1)[-1].split("/", 1)[0]
    return liveness_commands.liveness_args(["127.0.0.1", port, outputs["servedModelName"]])


def model_views(outputs: dict[str, Any]) -> list[ModelView]:
    """Each served model of a stack with several (its `models` output), with the node and
    container of its API server; [] for a single-model stack."""
    out = []
    for key, m in (outputs.get("models") or {}).items():
        role = f"{key}/{commands.LEADER}"
        node = next((n for n in outputs["nodes"] if role in n.get("containers", {})), None)
        if node is None:
            continue
        out.append(ModelView(key, m.get("servedModelName", key), node, node["containers"][role],
                             utilization=float((m.get("serving") or {}).get(
                                 "gpuMemoryUtilization") or node_memory.DEFAULT_UTILIZATION),
                             nodes=list(m.get("nodes") or [node["name"]]),
                             check=[str(v) for v in (m.get("serving") or {}).get("check", [])],
                             endpoint=str(m.get("endpoint") or "")))
    return out


def collect(stack: Any) -> Report:
    from pulumi import automation as auto

    # the key first: a wrong passphrase is said here, before anything else is read
    key = config_secret(stack, "sshPrivateKey")
    if key is None:
        raise LookupError(f"stack {stack.name}: {NAMESPACE}:sshPrivateKey is not set; set it "
                          f"with `pulumi config set --secret {NAMESPACE}:sshPrivateKey < KEYFILE`")
    try:
        outputs = {k: v.value for k, v in stack.outputs().items()}
    except auto.CommandError as err:
        raise errors.from_pulumi(err, f"reading the outputs of stack {stack.name}") from None
    if "nodes" not in outputs:
        raise LookupError(f"stack {stack.name} has no `nodes` output: run `pulumi up` first")
    nodes = outputs["nodes"]
    expected = outputs.get("containerIds") or {}
    report = Report(stack.name, outputs["endpoint"], outputs["servedModelName"],
                    nodes=nodes, key=key, gpu_memory_utilization=float(
                        (outputs.get("serving") or {}).get("gpuMemoryUtilization")
                        or node_memory.DEFAULT_UTILIZATION))
    check = liveness_check(outputs)
    image_out = outputs.get("image") or {}  # a stack deployed before it existed has none
    report.models = model_views(outputs)
    with ThreadPoolExecutor(max_workers=len(nodes) + 2 + len(report.models)) as pool:
        vllm = pool.submit(_ask_vllm, nodes[0], key, check) if not report.models else None
        asked = [pool.submit(_ask_vllm, m.node, key, m.check, m.container)
                 for m in report.models]
        endpoint = pool.submit(_ask_endpoint, report.endpoint,
                               "/health/liveliness" if report.models else "/health")
        views = list(pool.map(lambda i: _node_view(nodes[i], key, expected, i == 0,
                                                   image_out.get("name", "")),
                              range(len(nodes))))
        if vllm is not None:
            report.vllm_state, report.vllm = vllm.result()
        for m, answer in zip(report.models, asked, strict=True):
            m.state, m.seen = answer.result()
        if report.models:  # the worst model's state stands for vLLM's
            worst = next((m for m in report.models if not m.ok), report.models[0])
            report.vllm_state = worst.state
            report.vllm = "; ".join(f"{m.key}: {m.state}" for m in report.models)
        report.endpoint_ok, report.endpoint_check = endpoint.result()
    ray_table = None
    report.image = image_out.get("id", "")
    for node, (containers, unreachable, ray, cache_use, held) in zip(nodes, views, strict=True):
        report.containers += containers
        if why := image_mismatch(report.image, held, containers):
            report.image_mismatch[node["name"]] = why
        if cache_use:
            report.compile_cache[node["name"]] = cache_use
        if unreachable:
            report.unreachable[node["name"]] = unreachable
        if ray is not None:
            ray_table = ray
    if commands.HEAD not in nodes[0]["containers"]:  # backend native: no Ray
        report.ray_ok = True
        return report
    alive = {r["ip"]: r["gpus"] for r in ray_table or []}
    for node in nodes:
        ip = node["identityIp"]
        if ray_table is None:
            report.ray[node["name"]] = "unknown (the Ray head does not answer)"
        elif ip in alive:
            report.ray[node["name"]] = f"alive, {alive[ip]:g} GPU ({ip})"
        else:
            report.ray[node["name"]] = f"not in Ray's node table ({ip})"
    report.ray_ok = ray_table is not None and all(v.startswith("alive") for v in report.ray.values())
    return report
