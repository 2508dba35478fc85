"""A `docker` for a machine without Docker: the program's container layout, one mount namespace
per container. Used by the GPU tier (lab/gpu/runner.py), where the program's own rendered
start scripts, gate and liveness read run unchanged and call `docker` as on a node.

What a container is here, and what it is not:
- `docker run` starts ENTRYPOINT ARGS in a new mount namespace (`unshare --mount`) with a
  private tmpfs on /tmp (a container's /tmp is its own), the `--volume`s bound in (an anonymous
  `--volume /tmp/ray` is a host directory kept per container, `--volumes-from X` binds X's
  volumes), the env of `--env-file` and `--env` over a fixed "image" env (IMAGE_ENV), cwd /.
  Host network, PID and IPC: the program runs every container with `--network host --ipc host`,
  and the vLLM container with `--pid container:<head>`, so nothing else is needed for them.
- The image is the machine itself (its Python, the carried wheels): the tag is recorded only,
  unless SHIM_IMAGES names it (`{"tag": {"env": {...}, "dirs": [...]}}`): that image's env over
  the fixed one (its PATH, its venv) and its directories bound in as the image's own (the CPU
  tier's gateway runs LiteLLM from a venv of its own, beside vLLM's).
- A container's processes are the processes in its mount namespace: when its first process
  exits they are killed (Docker tears down the PID namespace) by its supervisor, which holds
  that namespace open from the start (a freed namespace's number is reused at once: a kill by
  number alone would reach another's processes). `rm --force` kills the first process and
  returns once the supervisor has ended.
- `--gpus` is recorded only: the GPU is the machine's.
Subcommands: run, inspect (the `--format` fields the program reads), image inspect, logs
[--tail N], rm [--force] [--volumes], exec [-i], cp SRC CONTAINER:DST, kill [-s SIG], version,
ps. Stdlib only.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

STATE = Path(os.environ.get("SHIM_STATE", "/run/spark-vllm-shim"))
VOLUMES = Path(os.environ.get("SHIM_VOLUMES", "/var/lib/spark-vllm-shim/volumes"))
# The env every container starts from (an image's ENV); the runner sets it from the machine.
IMAGE_ENV = json.loads(os.environ.get("SHIM_IMAGE_ENV", "{}"))
# Other images, by tag: each one's env over IMAGE_ENV and its directories (SHIM_IMAGE_DIRS')
IMAGES = json.loads(os.environ.get("SHIM_IMAGES", "{}"))


def die(msg: str, rc: int = 1) -> None:
    print(msg, file=sys.stderr)
    sys.exit(rc)


def cdir(name: str) -> Path:
    return STATE / name


def load(name: str) -> dict:
    try:
        return json.loads((cdir(name) / "config.json").read_text())
    except FileNotFoundError:
        return {}


def init_pid(name: str) -> int | None:
    try:
        return int((cdir(name) / "pid").read_text())
    except (FileNotFoundError, ValueError):
        return None


def exit_code(name: str) -> int | None:
    try:
        return int((cdir(name) / "exitcode").read_text())
    except (FileNotFoundError, ValueError):
        return None


def status(name: str) -> str:
    if exit_code(name) is not None:
        return "exited"
    pid = init_pid(name)
    if pid is None:
        return "created"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "exited"
    return "running"


def supervisor_alive(name: str) -> int:
    """The pid of the container's supervisor while it runs (checked by its command line: a
    pid recycled by another process is not it), else 0."""
    pid = int(_read(cdir(name) / "supervisor") or 0)
    if not pid:
        return 0
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return 0
    if b"_supervise" not in argv or name.encode() not in argv or state == "Z":
        return 0
    return pid


def wait_supervisor(name: str, deadline_s: float = 30) -> None:
    """Until the container's supervisor has ended: it kills what is left in the container's
    namespace and writes the exit code. A supervisor that outlived `rm` wrote that exit code
    late: into the directory `rm` was removing (left with only that file, the name stayed "in
    use": each later `docker run` of it failed with 125), or into the next container of that
    name (which then read "exited" while it ran)."""
    end = time.monotonic() + deadline_s
    while supervisor_alive(name):
        if time.monotonic() > end:
            die(f"Error response from daemon: the supervisor of {name} did not end within "
                f"{deadline_s:.0f} s")
        time.sleep(0.02)


def members(mntns: str) -> list[int]:
    """Every process whose mount namespace is `mntns` (a container's processes)."""
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if os.readlink(p / "ns" / "mnt") == mntns:
                    out.append(int(p.name))
            except OSError:
                pass
    return [pid for pid in out if pid != os.getpid()]


def kill_all(ns: str, sig: int = signal.SIGKILL) -> None:
    """Kill every process in mount namespace `ns`. Only while the caller holds that namespace
    open (the supervisor does, from the container's start): a namespace's inode number is
    reused at once once it is freed (`unshare --mount` twice shows the same number), and a
    kill by a freed number killed whatever had it next (a lab container's Ray head, in a CI
    run: SIGKILL, exit 137)."""
    for _ in range(50):
        pids = members(ns)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        time.sleep(0.1)


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return ""


def parse_env_file(path: str) -> dict[str, str]:
    env = {}
    for line in Path(path).read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, _, value = line.partition("=")
        env[key] = value
    return env


def cmd_run(argv: list[str], create: bool = False) -> None:
    flags_with_value = {"--name", "--label", "--network", "--ipc", "--shm-size", "--gpus",
                        "--volume", "-v", "--env-file", "--env", "-e", "--entrypoint", "--pid",
                        "--volumes-from", "--restart"}
    opts: dict[str, list[str]] = {}
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        flag = argv[i]
        if "=" in flag and flag.split("=", 1)[0] in flags_with_value:
            flag, value = flag.split("=", 1)
            opts.setdefault(flag, []).append(value)
        elif flag in flags_with_value:
            opts.setdefault(flag, []).append(argv[i + 1])
            i += 1
        else:
            opts.setdefault(flag, []).append("")
        i += 1
    image, args = argv[i], argv[i + 1:]
    name = (opts.get("--name") or [f"shim-{secrets.token_hex(4)}"])[-1]
    if cdir(name).exists():
        die(f"docker: Error response from daemon: Conflict. The container name \"/{name}\" is "
            "already in use.", 125)
    cid = secrets.token_hex(32)
    mounts: list[list[str]] = []  # [host path, container path, "anon" | "bind"]
    for v in opts.get("--volume", []) + opts.get("-v", []):
        src, _, dst = v.partition(":")
        if not dst:  # anonymous volume
            host = VOLUMES / cid / src.strip("/").replace("/", "_")
            host.mkdir(parents=True, exist_ok=True)
            mounts.append([str(host), src, "anon"])
        else:
            Path(src).mkdir(parents=True, exist_ok=True)
            mounts.append([src, dst.split(":")[0], "bind"])
    for other in opts.get("--volumes-from", []):
        theirs = load(other)
        if not theirs:
            die(f"docker: Error response from daemon: No such container: {other}", 125)
        mounts += [[h, c, "from"] for h, c, _ in theirs["mounts"]]
    other = IMAGES.get(image, {})
    env = {**IMAGE_ENV, **other.get("env", {})}
    for f in opts.get("--env-file", []):
        env.update(parse_env_file(f))
    for kv in opts.get("--env", []) + opts.get("-e", []):
        key, eq, value = kv.partition("=")
        if eq:
            env[key] = value
        elif key in os.environ:  # `--env NAME`: docker takes the caller's value, if it has one
            env[key] = os.environ[key]
    # the runner's fault injection for one container (never the program's): SHIM_EXTRA_ENV
    env.update(json.loads(os.environ.get("SHIM_EXTRA_ENV") or "{}").get(name, {}))
    entry = (opts.get("--entrypoint") or [""])[-1]
    command = ([entry] if entry else []) + args
    if not command:
        die("docker: no command", 125)
    cdir(name).mkdir(parents=True)
    config = {"name": name, "id": cid, "image": image, "env": env, "mounts": mounts,
              "command": command, "labels": opts.get("--label", []),
              "pid_mode": (opts.get("--pid") or [""])[-1], "created": time.time(),
              "private": os.environ.get("SHIM_PRIVATE_DIRS", "").split(":"),
              # the image's own files where they are on the machine (the CPU tier's venv is
              # under ~/.cache, a private dir): bound back over the private dirs
              "image_dirs": [*os.environ.get("SHIM_IMAGE_DIRS", "").split(":"),
                             *other.get("dirs", [])]}
    (cdir(name) / "config.json").write_text(json.dumps(config))
    if create:  # `docker create`: started later by `docker start`
        print(cid)
        return
    _launch(name)
    if "--detach" not in opts and "-d" not in opts:
        while status(name) == "running":
            time.sleep(0.1)
        sys.stdout.write(_read(cdir(name) / "log"))
        sys.exit(exit_code(name) or 0)
    print(cid)


def _launch(name: str) -> None:
    log = open(cdir(name) / "log", "ab")
    sup = subprocess.Popen([sys.executable, __file__, "_supervise", name],
                           stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                           start_new_session=True, close_fds=True)
    (cdir(name) / "supervisor").write_text(str(sup.pid))
    for _ in range(200):  # the container is "running" once its init has its namespace
        if (cdir(name) / "mntns").exists() or exit_code(name) is not None:
            break
        time.sleep(0.01)


def cmd_start(argv: list[str]) -> None:
    """`docker start NAME`: a created container (the native backend's rank 0: created, given
    its files by `docker cp`, then started)."""
    for name in argv:
        _must(name)
        if status(name) == "created":
            _launch(name)
        print(name)


def cmd_supervise(name: str) -> None:
    child = subprocess.Popen(["unshare", "--mount", "--propagation", "private", sys.executable,
                              __file__, "_init", name])
    (cdir(name) / "pid").write_text(str(child.pid))
    # hold the container's mount namespace open while it lives (see kill_all): once its init
    # has entered it (it writes its mntns first)
    held, ns = None, ""
    while child.poll() is None and not held:
        ns = _read(cdir(name) / "mntns")
        if ns:
            try:
                fd = os.open(f"/proc/{child.pid}/ns/mnt", os.O_RDONLY)
            except OSError:
                break
            if os.readlink(f"/proc/self/fd/{fd}") == ns:
                held = fd
            else:
                os.close(fd)
                break
        else:
            time.sleep(0.01)
    rc = child.wait()
    if held is not None:
        kill_all(ns)  # the PID namespace ends with its first process
        os.close(held)
    (cdir(name) / "exitcode").write_text(str(rc if rc >= 0 else 128 - rc))


def cmd_init(name: str) -> None:
    config = load(name)
    # Docker binds host paths whatever the container's /tmp: hold every source open before
    # /tmp is replaced (a source may live under the host's /tmp), bind it through its fd
    fds = [os.open(host, os.O_PATH) for host, _ctr, _kind in config["mounts"]]
    image_dirs = [d for d in config.get("image_dirs", []) if d]
    image_fds = [os.open(d, os.O_PATH) for d in image_dirs]
    # this process is already in the container's namespace; its state may be under /tmp too
    (cdir(name) / "mntns").write_text(os.readlink("/proc/self/ns/mnt"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=1777", "tmpfs", "/tmp"], check=True)
    # a container's writable layer: what it writes there dies with it (SHIM_PRIVATE_DIRS)
    for d in filter(None, config.get("private", [])):
        os.makedirs(d, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "tmpfs", d], check=True)
    for fd, d in zip(image_fds, image_dirs, strict=True):
        os.makedirs(d, exist_ok=True)
        # --no-canonicalize: mount would resolve the fd's link to its path, now the tmpfs's
        subprocess.run(["mount", "--no-canonicalize", "--bind", f"/proc/{os.getpid()}/fd/{fd}",
                        d], check=True, pass_fds=(fd,))
        os.close(fd)
    for fd, (_host, ctr, _kind) in zip(fds, config["mounts"], strict=True):
        os.makedirs(ctr, exist_ok=True)
        subprocess.run(["mount", "--bind", f"/proc/{os.getpid()}/fd/{fd}", ctr], check=True,
                       pass_fds=(fd,))
        os.close(fd)
    for staged, dst, script in config.get("pending_cp", []):  # `docker cp` before the start
        subprocess.run(["sh", "-c", script, "cp", staged, dst], check=True)
    os.chdir("/")
    cmd = config["command"]
    try:
        os.execvpe(cmd[0], cmd, config["env"])
    except OSError as err:
        print(f"exec {cmd[0]}: {err}", file=sys.stderr)
        sys.exit(127)


def _must(name: str) -> dict:
    config = load(name)
    if not config:
        die(f"Error: No such container: {name}")
    return config


def _existing(names: list[str], missing: str, failed: list[str]):  # type: ignore[no-untyped-def]
    """(name, config) of each container that exists; the others are reported as docker does
    (`missing` formatted with the name) and added to `failed`."""
    for name in names:
        config = load(name)
        if config:
            yield name, config
        else:
            print(missing.format(name=name), file=sys.stderr)
            failed.append(name)


def cmd_inspect(argv: list[str]) -> None:
    fmt = None
    if argv and argv[0] == "--format":
        fmt, argv = argv[1], argv[2:]
    elif argv and argv[0].startswith("--format="):
        fmt, argv = argv[0].split("=", 1)[1], argv[1:]
    failed: list[str] = []
    for name, config in _existing(argv, "Error: No such object: {name}", failed):
        code = exit_code(name)
        fields = {"{{.State.Status}}": status(name), "{{.State.ExitCode}}": str(code or 0),
                  "{{.Id}}": config["id"], "{{.Name}}": "/" + name}
        if fmt is None:
            print(json.dumps([{"Id": config["id"], "State": {"Status": fields["{{.State.Status}}"],
                                                           "ExitCode": code or 0}}]))
            continue
        out = fmt
        for k, v in fields.items():
            out = out.replace(k, v)
        print(out)
    sys.exit(1 if failed else 0)


def cmd_image(argv: list[str]) -> None:
    if argv[:1] != ["inspect"]:
        die(f"docker image {' '.join(argv)}: not emulated")
    fmt = argv[2] if len(argv) > 2 and argv[1] == "--format" else None
    image_id = "sha256:" + "0" * 64  # the machine is the image
    print(fmt.replace("{{.Id}}", image_id).replace("{{range .RepoDigests}}{{.}} {{end}}", "")
          if fmt else json.dumps([{"Id": image_id}]))


def cmd_logs(argv: list[str]) -> None:
    tail = None
    if argv and argv[0] == "--tail":
        tail, argv = int(argv[1]), argv[2:]
    name = argv[0]
    _must(name)
    lines = _read(cdir(name) / "log").splitlines()
    if tail is not None:
        lines = lines[-tail:] if tail else []
    sys.stdout.write("".join(line + "\n" for line in lines))


def cmd_rm(argv: list[str]) -> None:
    names = [a for a in argv if not a.startswith("-")]
    failed: list[str] = []
    for name, config in _existing(names, "Error response from daemon: No such container: {name}",
                                  failed):
        if status(name) == "running" and "--force" not in argv and "-f" not in argv:
            print(f"Error response from daemon: You cannot remove a running container {name}",
                  file=sys.stderr)
            failed.append(name)
            continue
        # the init killed, its supervisor (which holds the namespace) kills the rest and ends
        pid = init_pid(name)
        if supervisor_alive(name) and pid and exit_code(name) is None:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        wait_supervisor(name)
        if "--volumes" in argv or "-v" in argv:
            shutil.rmtree(VOLUMES / config["id"], ignore_errors=True)
        shutil.rmtree(cdir(name), ignore_errors=True)
        print(name)
    sys.exit(1 if failed else 0)


def cmd_exec(argv: list[str]) -> None:
    while argv and argv[0].startswith("-"):
        argv = argv[1:]  # -i: stdin is passed through as it is
    name, cmd = argv[0], argv[1:]
    config = _must(name)
    if status(name) != "running":
        die(f"Error response from daemon: container {name} is not running")
    pid = init_pid(name)
    os.execvp("nsenter", ["nsenter", "-t", str(pid), "-m", "--wd=/", "--", "env", "-i",
                          *[f"{k}={v}" for k, v in config["env"].items()], *cmd])


def cmd_cp(argv: list[str]) -> None:
    src, dst = argv[-2:]
    name, _, path = dst.partition(":")
    config = _must(name)
    src = os.path.abspath(src) + ("/." if src.endswith("/.") else "")
    if src.endswith("/."):
        script = 'mkdir -p "$2" && cp -a "$1" "$2"'
    else:
        script = 'cp -a "$1" "$2"'
    if status(name) == "created":  # kept here, copied in when it starts (after its mounts)
        staged = cdir(name) / "cp" / str(len(config.get("pending_cp", [])))
        staged.mkdir(parents=True)
        rc = subprocess.run(["sh", "-c", script, "cp", src, str(staged)]).returncode
        config.setdefault("pending_cp", []).append(
            [str(staged) + ("/." if src.endswith("/.") else "/" + os.path.basename(src)),
             path, script])
        (cdir(name) / "config.json").write_text(json.dumps(config))
        sys.exit(rc)
    if status(name) != "running":
        die(f"Error response from daemon: container {name} is not running")
    sys.exit(subprocess.run(["nsenter", "-t", str(init_pid(name)), "-m", "--", "sh", "-c",
                             script, "cp", src, path]).returncode)


def cmd_kill(argv: list[str]) -> None:
    sig = signal.SIGKILL
    if argv and argv[0] in ("-s", "--signal"):
        sig, argv = getattr(signal, "SIG" + argv[1].removeprefix("SIG")), argv[2:]
    for name in argv:
        _must(name)
        pid = init_pid(name)
        if pid is None or status(name) != "running":
            die(f"Error response from daemon: container {name} is not running")
        os.kill(pid, sig)
        print(name)


def cmd_ps(_argv: list[str]) -> None:
    for d in sorted(STATE.iterdir()) if STATE.exists() else []:
        print(d.name, status(d.name), exit_code(d.name))


def main(argv: list[str]) -> None:
    STATE.mkdir(parents=True, exist_ok=True)
    if not argv:
        die("usage: docker COMMAND")
    cmd, rest = argv[0], argv[1:]
    if cmd == "_supervise":
        cmd_supervise(rest[0])
    elif cmd == "_init":
        cmd_init(rest[0])
    elif cmd == "version":
        print("24.0.0-spark-vllm-shim")
    else:
        table = {"run": cmd_run, "create": lambda a: cmd_run(a, create=True),
                 "start": cmd_start, "inspect": cmd_inspect, "image": cmd_image, "logs": cmd_logs,
                 "rm": cmd_rm, "exec": cmd_exec, "cp": cmd_cp, "kill": cmd_kill, "ps": cmd_ps}
        if cmd not in table:
            die(f"docker {cmd}: not emulated by the GPU tier's shim")
        table[cmd](rest)


if __name__ == "__main__":
    main(sys.argv[1:])
