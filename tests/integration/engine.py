"""Drive the real Pulumi engine (Automation API, local file backend) against the lab, and read
back what really happened on the nodes (docker over SSH)."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pulumi import automation as auto

from lab import cluster, config, envsh, keys

REPO = Path(__file__).resolve().parents[2]
STACK = config.DEFAULT_STACK  # "lab"; lab N's (SPARK_VLLM_LAB=N) is labN
LOG_DIR = config.STATE_DIR / "logs"
# vllm-sim's pretend weight load (3 s) and torch.compile (2 s) shortened for the tests: ~50
# vLLM starts a run. Kept under every `env` a test sets (Lab.set); a test may override them.
TEST_ENV = {"VLLM_SIM_LOAD_SECONDS": "1", "VLLM_SIM_COMPILE_S": "0.5"}


def engine_env() -> dict[str, str]:
    """The same environment `source lab/env.sh` gives a user (engine on PATH, file backend)."""
    env = envsh.sourced()
    keep = ("PATH", "PULUMI_")
    return {k: v for k, v in env.items() if k.startswith(keep)}


@dataclass
class Step:
    op: str  # create, delete, same, replace, create-replacement, delete-replaced, …
    name: str  # the resource's name (last URN segment)
    phase: str  # "pre" (step started), "done", "failed"
    t: float
    diffs: tuple[str, ...] = ()  # the properties the engine saw change (refresh: state vs read)
    type: str = ""


@dataclass
class Run:
    steps: list[Step] = field(default_factory=list)
    output: list[str] = field(default_factory=list)
    events: list[str] = field(default_factory=list)  # every engine event, as JSON (`--json`)
    seconds: float = 0.0
    error: str | None = None

    def failure(self, tail: int = 1500) -> str:
        """Why the run failed, for an assertion message: the engine's lines that name an error
        (a step's FAILED line, the resource's `error:`), then the end of its output. The tail
        alone is mostly the stack's outputs, printed after the error."""
        if self.error is None:
            return "no error"
        named = [line.strip() for line in self.error.splitlines()
                 if "FAILED" in line or line.strip().startswith("error:")]
        named = list(dict.fromkeys(line[:400] for line in named))[:20]
        return "\n".join(["the run's errors:", *named, "... what the nodes hold now:",
                          nodes_snapshot(), "... its output ends:", self.error[-tail:]])

    def ops(self, phase: str = "pre") -> list[tuple[str, str]]:
        return [(s.op, s.name) for s in self.steps if s.phase == phase]

    def changed(self) -> dict[str, str]:
        """Resources (not providers) a run changes. The dynamic provider's default instance
        takes the stack's config as inputs, so any config change updates it: no resource of
        it changes for that."""
        return {s.name: s.op for s in self.steps if s.phase == "pre" and s.op != "same"
                and not s.type.startswith("pulumi:providers:")}


def failed_lines(run: Run, node: str, role: str) -> list[str]:
    """The FAILED lines a command printed (its script's text, quoted whole in the engine's
    error, holds the same words with `$why` where the outcome goes: never match that). `role`:
    what the command's log lines name after the node (ray-worker, vllm-rank, model copy to …)."""
    return [ln.strip() for ln in (run.error or "").splitlines()
            if ln.strip().startswith(f"[spark-vllm] {node}: {role}: FAILED:")]


# the fabric check, its gate and their component (components/fabric_check.py): a change of what
# it measures (an env value, an identity, the image) measures again, in place, before any
# container changes. Its gate takes the verdict's text: whether the engine updates it in place
# alongside is no part of what a test of a change asserts (it starts nothing either way)
FABRIC = {"fabric", "fabric-check", "fabric-gate"}
REMEASURED = "fabric-check"


def planned(run: Run) -> set[str]:
    """What a run changes, but the fabric check's gate (see FABRIC)."""
    return set(run.changed()) - {"fabric-gate"}


# every spark-vllm container on a node, its state and its last log lines (docker exec, not SSH:
# it works when a test broke a node's SSH)
_SNAPSHOT_SH = (
    "for c in $(docker ps -a --filter label=spark-vllm.role --format '{{.Names}}'); do "
    "echo \"  $c: $(docker inspect --format '{{.State.Status}} exit={{.State.ExitCode}} "
    "started={{.State.StartedAt}} finished={{.State.FinishedAt}}' $c)\"; "
    "docker logs --tail 12 $c 2>&1 | sed 's/^/    | /'; done")


def nodes_snapshot() -> str:
    """What a failed run left on each lab node, for its assertion message."""
    out = []
    try:
        for n in cluster.info().nodes:
            proc = subprocess.run(["docker", "exec", n.container, "sh", "-c", _SNAPSHOT_SH],
                                  capture_output=True, text=True, timeout=30)
            out.append(f"{n.name}:\n{proc.stdout.rstrip() or '  (no spark-vllm container)'}"
                       f"{proc.stderr.strip()[:300]}")
    except Exception as err:  # noqa: BLE001 - a snapshot must never hide the failure itself
        out.append(f"(no snapshot: {type(err).__name__}: {err})")
    return "\n".join(out)[-6000:]

def _recorder(run: Run) -> Any:
    def on_event(ev: auto.EngineEvent) -> None:
        run.events.append(json.dumps(ev, default=lambda o: getattr(o, "__dict__", str(o))))
        for phase, e in (("pre", ev.resource_pre_event), ("done", ev.res_outputs_event),
                         ("failed", ev.res_op_failed_event)):
            if e is not None:
                md = e.metadata
                diffs = tuple(md.diffs or ())
                if md.op.value == "refresh" and md.old and md.new:
                    # a refresh's event carries no diffs: compare what was read with the state
                    old, new = md.old.outputs or {}, md.new.outputs or {}
                    diffs = tuple(sorted(k for k in {*old, *new} if old.get(k) != new.get(k)))
                run.steps.append(Step(md.op.value, md.urn.split("::")[-1], phase,
                                      time.monotonic(), diffs, md.type))
    return on_event


@contextmanager
def _no_readback(stack: auto.Stack) -> Iterator[None]:
    """The Automation API's up, destroy and refresh read the stack's outputs and its history
    after the run: two more CLI runs (~1 s under the suite's load), whose results `_run` drops
    (a test reads the outputs itself, Lab.outputs). The CLI run itself is untouched."""
    stack.outputs = lambda: {}  # type: ignore[method-assign]
    stack.info = lambda *_a, **_k: _NO_SUMMARY  # type: ignore[method-assign]
    try:
        yield
    finally:
        del stack.outputs, stack.info  # the class's own again


_NO_SUMMARY = object()


def _value(key: str, value: Any) -> auto.ConfigValue:
    """A config value as the CLI takes it; `env` with Lab.TEST_ENV under it."""
    if key == "env" and isinstance(value, dict):
        value = {**TEST_ENV, **value}
    return auto.ConfigValue(value if isinstance(value, str) else json.dumps(value))


class Lab:
    """One stack on the lab, its config, and the nodes behind it. `work_dir`: the project whose
    program runs (another commit's, for an upgrade; the same stack, state and stack file)."""

    def __init__(self, work_dir: Path = REPO) -> None:
        os.environ.update(engine_env())
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        self.stack = auto.create_or_select_stack(
            stack_name=STACK, work_dir=str(work_dir),
            opts=auto.LocalWorkspaceOptions(env_vars=engine_env()))

    # --- config ---------------------------------------------------------------------------
    @staticmethod
    def secrets(api_key: str) -> dict[str, str]:
        return {"sshPrivateKey": keys.client_key().read_text(), "apiKey": api_key}

    def set(self, key: str, value: Any, path: bool = False) -> None:
        self.stack.set_config(f"spark-vllm:{key}", _value(key, value), path=path)

    def set_all(self, values: dict[str, Any], secrets: dict[str, str] | None = None) -> None:
        """Several keys in one CLI run (`pulumi config set-all`), secrets among them."""
        config = {f"spark-vllm:{k}": _value(k, v) for k, v in values.items()}
        config.update({f"spark-vllm:{k}": auto.ConfigValue(v, secret=True)
                       for k, v in (secrets or {}).items()})
        self.stack.set_all_config(config)

    def get(self, key: str) -> Any:
        value = self.stack.get_all_config()[f"spark-vllm:{key}"].value
        try:
            return json.loads(value)
        except ValueError:
            return value

    # --- engine -----------------------------------------------------------------------------
    def _run(self, verb: str, **kw: Any) -> Run:
        run = Run()
        log = (LOG_DIR / f"{verb}.log").open("a")
        log.write(f"\n===== {verb} {time.strftime('%T')}\n")

        def on_output(line: str) -> None:
            run.output.append(line)
            log.write(line + "\n")
            log.flush()

        start = time.monotonic()
        try:
            with _no_readback(self.stack):
                getattr(self.stack, verb)(on_event=_recorder(run), on_output=on_output, **kw)
        except auto.CommandError as err:
            run.error = str(err)
        finally:
            run.seconds = time.monotonic() - start
            log.close()
        return run

    def up(self, refresh: bool = False) -> Run:
        return self._run("up", refresh=refresh)

    def refresh(self) -> Run:
        return self._run("refresh")

    def preview(self, refresh: bool = False) -> Run:
        return self._run("preview", diff=True, refresh=refresh)

    def destroy(self) -> Run:
        return self._run("destroy")

    def outputs(self) -> dict[str, Any]:
        return {k: v.value for k, v in self.stack.outputs().items()}

    def state_resources(self) -> list[dict[str, Any]]:
        return self.stack.export_stack().deployment.get("resources", []) or []

    def command_outputs(self) -> dict[str, dict[str, Any]]:
        """Each remote.Command's outputs in the state, by resource name."""
        return {r["urn"].split("::")[-1]: r.get("outputs", {}) for r in self.state_resources()
                if r["type"] == "command:remote:Command"}


# --- the nodes ----------------------------------------------------------------------------

def node_sh(node: str, command: str, check: bool = True, timeout: float = 60) -> str:
    proc = subprocess.run(cluster.ssh_argv(node, command), capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{node}: {command!r} failed: {proc.stderr}")
    return proc.stdout


@dataclass(frozen=True)
class Container:
    node: str
    id: str
    name: str
    role: str
    identity: str
    started: str
    running: bool


def containers(nodes: list[str]) -> list[Container]:
    """Every container of the stack on the nodes, with its start time (from docker itself)."""
    out = []
    fmt = ('{{.Id}}|{{.Name}}|{{index .Config.Labels "spark-vllm.role"}}|'
           '{{index .Config.Labels "spark-vllm.identity"}}|{{.State.StartedAt}}|{{.State.Running}}')
    for node in nodes:
        ids = node_sh(node, f"docker ps -aq --no-trunc --filter label=spark-vllm.stack={STACK}")
        if not ids.split():
            continue
        text = node_sh(node, f"docker inspect --format '{fmt}' {' '.join(ids.split())}")
        for line in text.splitlines():
            cid, name, role, ident, started, running = line.split("|")
            out.append(Container(node, cid, name.lstrip("/"), role, ident, started,
                                 running == "true"))
    return out


@dataclass(frozen=True)
class DockerEvent:
    node: str
    t_ns: int
    action: str
    id: str
    name: str
    role: str


def docker_events(nodes: list[str], since: float, until: float) -> list[DockerEvent]:
    """Container events of the stack on every node between two host times (same kernel clock)."""
    out = []
    for node in nodes:
        text = node_sh(node, f"docker events --since {since:.3f} --until {until:.3f} "
                             f"--filter type=container --filter label=spark-vllm.stack={STACK} "
                             "--format '{{json .}}'")
        for line in text.splitlines():
            ev = json.loads(line)
            attrs = ev.get("Actor", {}).get("Attributes", {})
            out.append(DockerEvent(node, int(ev["timeNano"]), ev.get("Action", ev.get("status")),
                                   ev["id"], attrs.get("name", ""),
                                   attrs.get("spark-vllm.role", "")))
    return sorted(out, key=lambda e: e.t_ns)


def ray_nodes(head_node: str) -> list[dict[str, Any]]:
    """Ray's own node table, read on the head (alive nodes only)."""
    script = ("import json, ray; ray.init(address='auto', logging_level='ERROR', "
              "log_to_driver=False); print(json.dumps([{'ip': n['NodeManagerAddress'], "
              "'gpus': n['Resources'].get('GPU', 0)} for n in ray.nodes() if n['Alive']]))")
    text = node_sh(head_node, f"docker exec spark-vllm-{STACK}-ray-head python3 -c \"{script}\"")
    return sorted(json.loads(text.strip().splitlines()[-1]), key=lambda n: n["ip"])


def chat(endpoint: str, model: str, api_key: str, text: str = "hello") -> str:
    import urllib.request

    body = json.dumps({"model": model, "max_tokens": 16,
                       "messages": [{"role": "user", "content": text}]}).encode()
    req = urllib.request.Request(f"{endpoint}/chat/completions", data=body, headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {api_key}"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.load(resp)["choices"][0]["message"]["content"]


def captures_match(out: str = "tests/fixtures/previews") -> None:
    """The committed preview captures (what the PR-summary tests read) are today's program's
    plans: each change kind previewed on the deployed lab stack plans, resource by resource, the
    op its capture holds (`python -m lab.capture_previews --check`; `make captures` renews them)."""
    proc = subprocess.run([sys.executable, "-m", "lab.capture_previews", "--check", "--stack",
                           STACK, "--out", out], cwd=REPO, env={**os.environ, **engine_env()},
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]


def read_until(proc: subprocess.Popen[str], stop: Any, deadline_s: float) -> list[str]:
    """Lines of `proc`'s stdout until `stop(line)` is true, within `deadline_s`: a reader that
    cannot hang the suite (the watcher under test may never print what a test waits for). On
    the deadline, the process is killed and the test fails with what it printed."""
    lines: list[str] = []
    q: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            q.put(line)
        q.put(None)

    threading.Thread(target=pump, daemon=True).start()
    end = time.monotonic() + deadline_s
    while True:
        try:
            line = q.get(timeout=max(0.0, end - time.monotonic()))
        except queue.Empty:
            proc.kill()
            raise AssertionError(f"no end within {deadline_s:.0f} s; it printed:\n"
                                 + "".join(lines)[-3000:]) from None
        if line is None:
            return lines
        lines.append(line)
        if stop(line):
            return lines


def watch_until_repaired(*extra: str, deadline_s: float = 300) -> list[str]:
    """`spark-vllm status --watch EXTRA…` on the lab's stack, its output until it says it
    repaired ("repaired: serving again") or gave up ("stopping:"), then stopped."""
    watcher = subprocess.Popen(
        [sys.executable, "-m", "spark_vllm.status", "--stack", STACK, "--watch", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
        env={**os.environ, **engine_env()})
    try:
        return read_until(watcher, lambda line: "repaired: serving again" in line
                          or "stopping:" in line, deadline_s=deadline_s)
    finally:
        watcher.terminate()
        watcher.wait(timeout=60)
