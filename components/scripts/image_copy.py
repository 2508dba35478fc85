"""spark-vllm's image copy (imageStaging: copy), run on the head with its python3 (stdlib only),
one per other node: `python3 PROGRAM KEYFILE`, the program preceded by `PAYLOAD = {…}` (the
tag, the node and how the head reaches it, the transport, the stack) and `HELPERS = {…}` (the
sources of scripts/image_check.py, whose SSH options it uses rather than repeats, and of
scripts/image_layers.py, which says which layers the node lacks).

1. Asks the node which image it holds under the tag, which layers every image there has, and
   what its Docker storage has free. A node that holds the head's image id gets nothing.
2. A node with none of the image's layers (a first copy) gets `docker save` as it streams:
   no pass over the head's disk but Docker's own. A node with some of them gets the save's
   files but the layers it has already (a layer is there when an image on the node has the
   same chain of layers below it and it: Docker's own test when it loads, the layer store's
   chain ID). `docker load` skips a layer whose chain it has without opening its file
   (moby image/tarexport/load.go), so a tar without those files loads. Which file is which
   layer is only known from the save's manifest, written last, so that save is spooled first
   (~/.spark-vllm/image-spool/<stack>/<id>, under a lock: the copies to several nodes share
   it; the last one out removes it).
3. Refuses, with the numbers and before a byte moves, a node whose Docker storage cannot take
   the missing layers twice over (`docker load` unpacks the stream into Docker's temp
   directory, then each layer into the store).
4. Streams the plan into the node's `docker load`, over SSH to its identity (fabric) address,
   or raw TCP there (copyTransport tcp: a receiver on the node, a one-time token), saying every
   10 s what moved, how fast and how long is left.
5. Verifies by image id: the node must hold the head's id under the tag. An image that arrived
   as another id is named, removed and sent once more; a load that Docker refused (bytes
   damaged on the way fail its layer hashes; an image store that does not skip the layers left
   out) is sent once more, whole. Docker's own error is quoted when it refuses twice.
An interrupted copy leaves nothing half-loaded to run: `docker load` tags the image only once
every layer is in, and the next `up` copies again. The last copy out removes the spool.
Prints one JSON line: what moved. (No `from __future__` import: the PAYLOAD line comes first.)
"""

import fcntl
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import types
from typing import Any

PROGRESS_EVERY_S = 10
MB = 1_000_000
CHUNK = 1 << 20
SAVING: list[str] = []  # the spool this copy is writing, while it writes it
PAYLOAD_PREFIX = ""  # the shell's log prefix ("[spark-vllm] node-1: image copy to node-2: ")


def log(msg: str) -> None:
    print(f"{PAYLOAD_PREFIX}{msg}", file=sys.stderr, flush=True)


def helper(name: str) -> types.ModuleType:
    mod = types.ModuleType(name)
    exec(compile(globals()["HELPERS"][name], f"{name}.py", "exec"), mod.__dict__)
    return mod


class Meter:
    """Bytes moved, said every PROGRESS_EVERY_S until stopped."""

    def __init__(self, what: str, total: int | None, waiting: str = "") -> None:
        self.what, self.total, self.done, self.waiting = what, total, 0, waiting
        self.read: Any = None  # where the count comes from when no Counting sees the bytes
        self.start = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(PROGRESS_EVERY_S):
            self.poll()
            secs = time.monotonic() - self.start
            rate = self.done / secs / MB if secs else 0.0
            if not self.done and self.waiting:
                log(f"{self.what}: {self.waiting} ({secs:.0f} s)")
            elif self.total:
                total = max(self.total, self.done)  # a stream's total is an estimate
                left = (total - self.done) / (rate * MB) if rate else None
                log(f"{self.what}: {self.done // MB} of {total // MB} MB "
                    f"({100 * self.done // total} %), {rate:.1f} MB/s, "
                    f"ETA {f'{left:.0f} s' if left is not None else 'unknown'}")
            else:
                log(f"{self.what}: {self.done // MB} MB after {secs:.0f} s ({rate:.1f} MB/s)")

    def poll(self) -> None:
        if self.read is not None:
            self.done = max(self.done, self.read())

    def stop(self) -> float:
        self._stop.set()
        self.poll()
        return time.monotonic() - self.start


def bytes_read(pid: int) -> int:
    """What a process has read so far (Linux /proc/PID/io `rchar`; 0 where it cannot say)."""
    try:
        with open(f"/proc/{pid}/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))
    except (OSError, StopIteration, ValueError):
        return 0


class Counting:
    """A file-like reader or writer that counts the bytes through it into a Meter."""

    def __init__(self, f: Any, meter: Meter) -> None:
        self.f, self.meter = f, meter

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.meter.done += len(data)
        return data

    def write(self, data: bytes) -> int:
        self.f.write(data)
        self.meter.done += len(data)
        return len(data)


def spool_image(image: str, image_id: str, base: str) -> tuple[str, Any]:
    """The head's image saved once into base/<id> (a lock: one saver, the other copies wait and
    read it). Returns the directory and the lock, held shared while the caller sends."""
    os.makedirs(base, mode=0o700, exist_ok=True)
    hexid = image_id.split(":")[-1]
    spool = os.path.join(base, hexid)
    lock = open(os.path.join(base, ".lock"), "a+")
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        if not os.path.exists(os.path.join(spool, ".complete")):
            for old in os.listdir(base):  # another image's spool, or a save cut short
                if not old.startswith("."):
                    shutil.rmtree(os.path.join(base, old), ignore_errors=True)
            proc = subprocess.run(["docker", "image", "inspect", "--format", "{{.Size}}", image],
                                  capture_output=True, text=True)
            size = int(proc.stdout.strip() or 0)
            free = shutil.disk_usage(base).free
            if size > free:
                raise SystemExit(f"the head has {free // MB} MB free in {base}, the image's "
                                 f"save needs {size // MB} MB there (it is removed once every "
                                 "node has the image)")
            os.makedirs(spool, mode=0o700)
            SAVING.append(spool)  # a signal now removes it (this copy holds the lock)
            meter = Meter(f"saving {image} on the head (docker save)", size,
                          "Docker exports the image before it sends its first byte")
            save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE)
            try:
                src: Any = Counting(save.stdout, meter)
                with tarfile.open(fileobj=src, mode="r|") as tar:
                    for member in tar:
                        name = os.path.normpath(member.name)
                        if name.startswith(("/", "..")) or member.isdev():
                            raise SystemExit(f"docker save wrote an unexpected entry {name!r}")
                        tar.extract(member, spool, set_attrs=False)
            finally:
                meter.stop()
                err = save.stderr.read().decode(errors="replace").strip() if save.stderr else ""
                rc = save.wait()
            if rc != 0:
                raise SystemExit(f"docker save {image} on the head failed: {err}")
            with open(os.path.join(spool, "manifest.json")) as f:
                config = json.load(f)[0]["Config"]
            if hexid not in config:  # the tag moved between the inspect and the save
                raise SystemExit(f"{image} changed on the head while it was saved ({image_id} "
                                 f"before, {config} in the save): run pulumi up again")
            open(os.path.join(spool, ".complete"), "w").close()
            SAVING.clear()
    except BaseException:
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()
        raise
    fcntl.flock(lock, fcntl.LOCK_SH)
    return spool, lock


def release_spool(spool: str, lock: Any) -> None:
    """The last copy out removes the spool (another one sending holds the lock shared)."""
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.close()
        return
    shutil.rmtree(spool, ignore_errors=True)
    lock.close()


def write_tar(out: Any, spool: str, files: list[str]) -> None:
    """The spool's `files` as one tar stream into `out` (a pipe or a socket)."""
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.GNU_FORMAT) as tar:
        for rel in files:
            tar.add(os.path.join(spool, rel), arcname=rel, recursive=False)


class Source:
    """What goes into the node's docker load: the head's `docker save` as it streams (every
    layer), or the spool's files (the layers the node lacks)."""

    def __init__(self, total: int, waiting: str = "") -> None:
        self.total, self.waiting = total, waiting

    def write(self, out: Any, copy: "Copy") -> None:
        raise NotImplementedError


class SaveStream(Source):
    """`docker save` piped straight through: no pass over the head's disk but Docker's own."""

    def __init__(self, image: str, total: int) -> None:
        super().__init__(total, "Docker exports the image before it sends its first byte")
        self.image = image

    def write(self, out: Any, copy: "Copy") -> None:
        save = copy._spawn(["docker", "save", self.image])
        assert save.stdin and save.stdout and save.stderr
        save.stdin.close()
        try:
            while chunk := os.read(save.stdout.fileno(), CHUNK):
                out.write(chunk)
        except BaseException:  # the node's end went away: docker save must not wait for it
            save.kill()
            raise
        err = save.stderr.read().decode(errors="replace").strip()
        if save.wait() != 0:
            raise SystemExit(f"docker save {self.image} on the head failed: {err}")


class SpoolFiles(Source):
    def __init__(self, spool: str, files: list[str], total: int) -> None:
        super().__init__(total)
        self.spool, self.files = spool, files

    def write(self, out: Any, copy: "Copy") -> None:
        write_tar(out, self.spool, self.files)


class Copy:
    def __init__(self, key: str, tmp: str, p: dict[str, Any], ssh: types.ModuleType,
                 lay: types.ModuleType) -> None:
        self.key, self.tmp, self.p, self.ssh, self.lay = key, tmp, p, ssh, lay
        self.node = p["node"]
        self.children: list[subprocess.Popen[bytes]] = []
        self.spool: tuple[str, Any] | None = None  # the spool and its lock, while it is read

    def on_node(self, script: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        argv = self.ssh.ssh_argv(self.key, self.tmp, self.node, script)
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise SystemExit(f"{self.node['name']} did not answer within {timeout:.0f} s") from None

    def probe(self) -> dict[str, Any]:
        proc = self.on_node(self.lay.probe_script(self.p["image"]))
        if proc.returncode != 0:
            raise SystemExit(f"cannot reach {self.where()} over the fabric from the head: "
                             f"{proc.stderr.strip() or f'exit {proc.returncode}'}")
        return self.lay.parse_probe(proc.stdout)

    def where(self) -> str:
        n = self.node
        return f"{n['name']} ({n['user']}@{n['ip']})"

    def send(self, source: Source) -> tuple[int, str]:
        """(docker load's exit code, what it said) after `source` went into it."""
        meter = Meter(f"copying to {self.node['name']}", source.total, source.waiting)
        try:
            if self.p["transport"] == "tcp":
                return self._send_tcp(source, meter)
            return self._send_ssh(source, meter)
        finally:
            self.seconds = meter.stop()
            self.sent = meter.done

    def _send_ssh(self, source: Source, meter: Meter) -> tuple[int, str]:
        # `-q`: docker load without its progress output, which cost 3.5 s of 14 on the lab
        argv = self.ssh.ssh_argv(self.key, self.tmp, self.node, "docker load -q")
        if isinstance(source, SaveStream):
            return self._stream_ssh(source, argv, meter)
        load = self._spawn(argv)
        assert load.stdin
        err = _drain(load)
        try:
            source.write(Counting(load.stdin, meter), self)
            load.stdin.close()
        except BrokenPipeError:
            pass
        rc = load.wait()
        return rc, err()

    def _stream_ssh(self, source: SaveStream, argv: list[str],
                    meter: Meter) -> tuple[int, str]:
        """docker save's output is ssh's input, with nothing between them (a relay through
        Python cost 10 % on the lab); the bytes moved are what ssh has read."""
        save = self._spawn(["docker", "save", source.image])
        assert save.stdin and save.stdout and save.stderr
        save.stdin.close()
        load = subprocess.Popen(argv, stdin=save.stdout, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        self.children.append(load)
        save.stdout.close()  # ssh holds it now: docker save sees the pipe close if ssh ends
        meter.read = lambda: bytes_read(load.pid)
        err = _drain(load)
        # its last count before it is reaped (a zombie's /proc/PID/io still answers)
        os.waitid(os.P_PID, load.pid, os.WEXITED | os.WNOWAIT)
        meter.poll()
        rc = load.wait()
        said = save.stderr.read().decode(errors="replace").strip()
        if save.wait() != 0 and rc == 0:
            raise SystemExit(f"docker save {source.image} on the head failed: {said}")
        if rc != 0:
            save.kill()
        return rc, err()

    def _send_tcp(self, source: Source, meter: Meter) -> tuple[int, str]:
        ip = self.node["ip"]
        recv = self._spawn(self.ssh.ssh_argv(self.key, self.tmp, self.node,
                                             f"python3 - '{ip}'"))
        assert recv.stdin and recv.stdout
        recv.stdin.write(globals()["HELPERS"]["image_receiver"].encode())
        recv.stdin.close()
        line = recv.stdout.readline().decode(errors="replace").split()
        if len(line) != 3 or line[0] != "listening":
            recv.kill()
            err = recv.stderr.read().decode(errors="replace") if recv.stderr else ""
            raise SystemExit(f"the receiver on {self.node['name']} did not start: "
                             f"{err.strip() or line}")
        err = _drain(recv)
        try:
            with socket.create_connection((ip, int(line[1])), timeout=30) as conn:
                conn.settimeout(600)
                conn.sendall(line[2].encode())
                with conn.makefile("wb", buffering=CHUNK) as out:
                    source.write(Counting(out, meter), self)
        except OSError as e:
            recv.kill()
            raise SystemExit(f"the raw TCP copy to {self.where()} failed: {e}") from None
        rc = recv.wait()
        return rc, err()

    def _spawn(self, argv: list[str]) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        self.children.append(proc)
        return proc

    def remove_other(self, got: str) -> None:
        """An image that arrived as another id: untag it and remove it (unless a container
        uses it)."""
        self.on_node(f"docker image rm {shlex.quote(self.p['image'])} >/dev/null 2>&1; "
                     f"docker image rm {got} >/dev/null 2>&1; true")

    def held_id(self) -> str:
        """The id the node holds under the tag now ("" when none): the check after a load,
        which needs nothing else the probe reads."""
        proc = self.on_node(f"docker image inspect --format '{{{{.Id}}}}' "
                            f"{shlex.quote(self.p['image'])} 2>/dev/null || true")
        if proc.returncode != 0:
            raise SystemExit(f"cannot reach {self.where()} over the fabric from the head: "
                             f"{proc.stderr.strip() or f'exit {proc.returncode}'}")
        return proc.stdout.strip()


def _drain(proc: subprocess.Popen[bytes]) -> Any:
    """Read a child's stdout and stderr as it runs (a full pipe would stop it); returns what it
    said, once it ended."""
    said: list[bytes] = []

    def read(f: Any) -> None:
        for line in iter(f.readline, b""):
            said.append(line)

    threads = [threading.Thread(target=read, args=(f,), daemon=True)
               for f in (proc.stdout, proc.stderr) if f]
    for t in threads:
        t.start()

    def result() -> str:
        for t in threads:
            t.join(30)
        return b"".join(said).decode(errors="replace").strip()
    return result


def main(key: str, p: dict[str, Any]) -> int:
    global PAYLOAD_PREFIX
    PAYLOAD_PREFIX = p["logPrefix"]
    ssh, lay = helper("image_check"), helper("image_layers")
    image, name = p["image"], p["node"]["name"]
    proc = subprocess.run(["docker", "image", "inspect", "--format",
                           "{{.Id}} {{.Size}} {{range .RootFS.Layers}}{{.}} {{end}}", image],
                          capture_output=True, text=True)
    head_id, _, rest = proc.stdout.strip().partition(" ")
    size, _, layer_text = rest.partition(" ")
    head_size, head_layers = int(size or 0), layer_text.split()
    if proc.returncode != 0 or not head_id:
        raise SystemExit(f"image {image} is not on the head ({p['head']}): imageStaging copy "
                         "copies the head's; its preflight pulls it there per imagePull, or "
                         f"build it there (docker build -t {image} …)")
    with tempfile.TemporaryDirectory() as tmp:
        copy = Copy(key, tmp, p, ssh, lay)
        signal.signal(signal.SIGTERM, lambda *_: _end(copy))
        signal.signal(signal.SIGHUP, lambda *_: _end(copy))
        have = copy.probe()
        if have["id"] == head_id:
            log(f"{name} holds {image} as {head_id[:19]} already: nothing to copy")
            print(json.dumps({"node": name, "image": head_id, "sent": 0, "seconds": 0,
                              "layers": "all there"}))
            return 0
        start = time.monotonic()
        transport = "raw TCP (unencrypted)" if p["transport"] == "tcp" else "SSH"
        have_layers = sum(c in have["chains"] for c in lay.chain_ids(head_layers))
        if have_layers == 0:
            # the node has none of it (a first copy): docker save streams straight to the node
            layers = of = len(head_layers)
            source: Source = SaveStream(image, head_size)
            if problem := lay.space_problem(name, have["free"], have["root"], head_size):
                raise SystemExit(problem)
            log(f"copying {image} ({head_id[:19]}) to {copy.where()} over {transport}: every "
                f"layer ({of}), about {head_size // MB} MB, as docker save streams it")
            sent = send_verified(copy, source, head_id, lambda: source)
        else:
            spool, lock = spool_image(image, head_id, os.path.expanduser(p["spool"]))
            copy.spool = (spool, lock)
            try:
                files, total, whole, layers, of = lay.plan(spool, have["chains"])
                if problem := lay.space_problem(name, have["free"], have["root"], total):
                    raise SystemExit(problem)
                log(f"copying {image} ({head_id[:19]}) to {copy.where()} over {transport}: "
                    f"{layers} of {of} layers, {total // MB} of {whole // MB} MB (the rest is "
                    "there)")

                def every_layer() -> Source:
                    all_files, all_bytes = lay.plan(spool, set())[:2]
                    return SpoolFiles(spool, all_files, all_bytes)
                sent = send_verified(copy, SpoolFiles(spool, files, total), head_id, every_layer)
            finally:
                release_spool(spool, lock)
                copy.spool = None
        seconds = time.monotonic() - start  # the save or spool, the sends, the id checks
        log(f"ready: {name} holds {image} as {head_id[:19]} ({sent} bytes sent, {seconds:.1f} s "
            "in all)")
        print(json.dumps({"node": name, "image": head_id, "sent": sent,
                          "seconds": round(seconds, 2), "layers": f"{layers} of {of}"}))
    return 0


def send_verified(copy: Copy, source: Source, head_id: str, again: Any) -> int:
    """Send `source`, then check the node's id; once more (`again()`: every layer) when Docker
    refused it or it arrived as another id. Returns the bytes sent in all."""
    name, image = copy.node["name"], copy.p["image"]
    sent = 0
    for attempt in (1, 2):
        rc, said = copy.send(source)
        sent += copy.sent
        if rc != 0:
            if attempt == 2:
                raise SystemExit(f"{name}'s Docker cannot load the image (docker load, exit "
                                 f"{rc}), twice: {said or 'no message'}")
            # bytes damaged on the way (Docker checks every layer against its hash), or an
            # image store that will not skip the layers it has: once more, every layer
            why = said.splitlines()[-1] if said else f"exit {rc}"
            log(f"{name}'s Docker refused the image ({why}): sending it again")
            source = again()
            continue
        got = copy.held_id()
        if got == head_id:
            return sent
        if got:
            copy.remove_other(got)
        what = (f"as {got}, not the head's {head_id}" if got else
                f"and {image} is not there after docker load said: {said}")
        if attempt == 2:
            raise SystemExit(f"the image arrived on {name} {what}, twice: removed; check the "
                             "node's Docker and disk")
        log(f"the image arrived on {name} {what}: removed, sending it again")
        source = again()
    return sent


def _end(copy: Copy) -> None:
    """A signal (the up interrupted): end what this started (the node's docker load sees its
    stream end early and loads nothing) and leave no spool behind, unless another copy still
    reads it."""
    for child in copy.children:
        child.kill()
    for partial in SAVING:
        shutil.rmtree(partial, ignore_errors=True)
    if copy.spool:
        release_spool(*copy.spool)
    os._exit(1)


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1], json.loads(globals()["PAYLOAD"])))
    except SystemExit as e:
        if isinstance(e.code, str):
            log(f"FAILED: {e.code}")
            sys.exit(1)
        raise
