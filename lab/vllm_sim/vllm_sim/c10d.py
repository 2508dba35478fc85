"""torch.distributed's tcp:// rendezvous (the TCPStore) as vLLM's native multi-node mode meets it.

With `--nnodes N > 1` every rank calls torch.distributed.init_process_group(backend="nccl",
init_method="tcp://MASTER_ADDR:MASTER_PORT") (vllm/distributed/parallel_state.py:1875-1878,
1976-1983 in vLLM 0.33.0): global rank 0 hosts a TCPStore there, every other rank is its client
(torch/distributed/rendezvous.py:178-223 _create_c10d_store, :226-252 _tcp_rendezvous_handler,
torch 2.14.0). vLLM passes no timeout unless --distributed-timeout-seconds
(vllm/v1/worker/gpu_worker.py:1710-1712), so torch's default for NCCL applies:
_get_default_timeout (torch/distributed/distributed_c10d.py:1387-1400) = default_pg_nccl_timeout
= kProcessGroupNCCLDefaultTimeout, 10 minutes (torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp
:160-161); the store gets that timeout (distributed_c10d.py:2501-2502, 2543-2547).

What torch does, and what this module does the same way (C++ source read at
torch/csrc/distributed/c10d/{TCPStore,socket,Backoff}.cpp; every message text below is in
torch 2.14.0's libtorch_cpu.so; the log prefix, the line numbers and the timing were OBSERVED
with torch 2.11.0 on the GPU machine, 2026-12-01, by lab/vllm_sim/c10d_probe.py (2.14.0's line
numbers are not known)):
- the master binds the port on every local address (the libuv backend; a taken port:
  "The server socket has failed to listen on any local network address. port: P, useIpv6:
  false, code: -98, name: EADDRINUSE, message: address already in use"), connects to itself as
  a client, then waitForWorkers: every 10 ms, until world_size clients counted itself included;
  past the timeout (whole seconds, `elapsed > timeout`) DistStoreError "Timed out after 601
  seconds waiting for clients. 1/2 clients joined." (observed with 6 s: "after 7 seconds").
- a client's TCPStore constructor: deadline = now + timeout; TCPClient::connect, on a
  DistNetworkError: past the deadline -> ERROR "TCP client failed to connect/validate to host
  H:P - timed out (try=N, timeout=Tms): ..." and raise; else WARNING "... - retrying (try=N,
  timeout=Tms, delay=Dms): ..." and sleep D (one ExponentialBackoffWithJitter shared with the
  socket: 500 ms, x1.5, +-50 %, at most 60 s).
- the socket (SocketConnectOp): connect_timeout = the store's timeout; a refused or reset
  connect is retried after the next backoff delay, logged only at TRACE level ("The server
  socket on [localhost]:P is not yet listening (errno: 111 - Connection refused), will retry.")
  and, every 30 s, INFO "No socket on (H, P) is listening yet, will retry."; when the next delay
  would pass its deadline: ERROR "The client socket has timed out after Tms while trying to
  connect to (H, P)." and a TimeoutError (a DistNetworkError). So at torch's default log level
  (WARNING; TORCH_CPP_LOG_LEVEL=INFO and TORCH_DISTRIBUTED_DEBUG=DETAIL show the rest) a rank
  whose master is not listening PRINTS NOTHING until its first timeout, then retries once more
  for up to the whole timeout again: with 600 s, ~20 minutes before it fails (observed with 8 s:
  13 s; with 36 s: 62 s).
- after the group formed, ProcessGroupNCCL's heartbeat monitor (default PG) checks the store
  every second (observed, torch 2.11.0): once the master is gone every check logs a
  "recvValue failed"/"sendBytes failed ... Broken pipe" warning and "Failed to check the
  "should dump" flag on TCPStore, (maybe TCPStore server has shut down too early), with error:
  ...", and the process keeps running. torch 2.14.0 no longer has that last text (its
  replacement starts 'TCPStore check for dump key "' - the rest is not known): played for
  vLLM 0.33.0 as the TCPStore warnings alone.

Simulator liberties: the wire protocol is JSON lines, not torch's; the C++ frames under
"Exception raised from ..." are not printed; on one machine (the tests' 127.0.0.x "nodes") a
client binds its source address to VLLM_HOST_IP when that address is local, so its connection
shows the node's address in the socket table (real torch lets the kernel choose).
"""

from __future__ import annotations

import errno as errno_mod
import json
import os
import random
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any


def _named_exception(module: str, name: str, base: type[BaseException]) -> type[BaseException]:
    """An exception class that prints as the real one in a traceback (module.Name: message)."""
    cls = type(name, (base,), {})
    cls.__module__ = module
    cls.__qualname__ = name
    return cls


# torch.distributed's exceptions as Python prints them (torch/distributed/__init__.py
# re-exports torch._C._distributed_c10d's DistError, DistNetworkError, DistStoreError)
DistError = _named_exception("torch.distributed", "DistError", RuntimeError)
DistNetworkError = _named_exception("torch.distributed", "DistNetworkError", DistError)
DistStoreError = _named_exception("torch.distributed", "DistStoreError", DistError)

# torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp:160-161 (torch 2.14.0)
DEFAULT_PG_NCCL_TIMEOUT_S = 600
# TORCH_NCCL_COORD_CHECK_MILSEC default: the heartbeat monitor's store check (observed: 1 s)
HEARTBEAT_CHECK_S = 1.0
# c10d's "static auto lastLog": one per process, set at the first retry
_NOT_LISTENING_LOG_S = 30.0


# --- c10d's logging: c10 LOG(...) lines on stderr --------------------------------------------

class TorchLog:
    """c10d's log macros (torch/csrc/distributed/c10d/logging.h, logging.cpp isLogLevelEnabled):
    INFO/WARNING/ERROR against TORCH_CPP_LOG_LEVEL (default WARNING); debug and trace only at
    INFO and with TORCH_DISTRIBUTED_DEBUG=INFO (debug) or DETAIL (trace)."""

    _LEVELS = {"INFO": 0, "WARNING": 1, "ERROR": 2, "FATAL": 3}

    def __init__(self) -> None:
        raw = os.environ.get("TORCH_CPP_LOG_LEVEL", "WARNING").strip().upper()
        self.level = int(raw) if raw.isdigit() else self._LEVELS.get(raw, 1)
        self.debug_level = os.environ.get("TORCH_DISTRIBUTED_DEBUG", "OFF").strip().upper()
        self.rank_prefix = ""  # "[rank1]:" once the process group exists (observed)
        self._lock = threading.Lock()
        if self.level == 0 and self.debug_level in ("INFO", "DETAIL"):
            self.emit("I", "debug.cpp", 48, f"[c10d] The debug level is set to {self.debug_level}.")

    def enabled(self, kind: str) -> bool:
        if kind == "trace":
            return self.level == 0 and self.debug_level == "DETAIL"
        if kind == "debug":
            return self.level == 0 and self.debug_level in ("INFO", "DETAIL")
        return self.level <= {"I": 0, "W": 1, "E": 2}[kind]

    def emit(self, sev: str, file: str, line: int, text: str) -> None:
        now = time.time()
        lt = time.localtime(now)
        nanos = int((now % 1) * 1e9)
        stamp = f"{lt.tm_mon:02d}{lt.tm_mday:02d} {lt.tm_hour:02d}:{lt.tm_min:02d}:{lt.tm_sec:02d}"
        with self._lock:
            sys.stderr.write(f"{self.rank_prefix}[{sev}{stamp}.{nanos:09d} {file}:{line}] {text}\n")
            sys.stderr.flush()

    def raw(self, text: str) -> None:
        with self._lock:
            sys.stderr.write(text)
            sys.stderr.flush()

    def info(self, file: str, line: int, text: str) -> None:
        if self.enabled("I"):
            self.emit("I", file, line, f"[c10d] {text}")

    def warning(self, file: str, line: int, text: str) -> None:
        if self.enabled("W"):
            self.emit("W", file, line, f"[c10d] {text}")

    def error(self, file: str, line: int, text: str) -> None:
        if self.enabled("E"):
            self.emit("E", file, line, f"[c10d] {text}")

    def debug(self, file: str, line: int, text: str) -> None:
        if self.enabled("debug"):
            self.emit("I", file, line, f"[c10d - debug] {text}")

    def trace(self, file: str, line: int, text: str) -> None:
        if self.enabled("trace"):
            self.emit("I", file, line, f"[c10d - trace] {text}")


def raised_from(where: str) -> str:
    """The C++ backtrace c10::Error appends to what() (observed), frames left out."""
    return f"\nException raised from {where} (most recent call first):\n"


class ExponentialBackoffWithJitter:
    """torch/csrc/distributed/c10d/Backoff.cpp, with Backoff.hpp's defaults."""

    def __init__(self) -> None:
        self.initial_ms, self.factor, self.multiplier, self.max_ms = 500, 0.5, 1.5, 60000
        self.current_ms = 0

    def next_backoff_ms(self) -> int:
        if self.current_ms == 0:
            self.current_ms = self.initial_ms
        spread = int(self.factor * self.current_ms)
        delay = random.randint(self.current_ms - spread, self.current_ms + spread)
        self.current_ms = min(int(self.current_ms * self.multiplier), self.max_ms)
        return delay


def addr_repr(host: str, port: int) -> str:
    """How c10d prints an address: the dual-stack socket's peer through getnameinfo, so
    "[localhost]:P" for 127.0.0.1 and "[::ffff:10.0.0.2]:P" for an IPv4 address without a name
    (observed; other names are not looked up here)."""
    if host in ("127.0.0.1", "localhost", "::1"):
        return f"[localhost]:{port}"
    try:
        socket.inet_aton(host)
        return f"[::ffff:{host}]:{port}"
    except OSError:
        return f"[{host}]:{port}"


def socket_repr(sock: socket.socket) -> str:
    """SocketImpl's repr in c10d's warnings (observed): fd, local and remote address."""
    try:
        local = sock.getsockname()
        remote = sock.getpeername()
        return (f"SocketImpl(fd={sock.fileno()}, addr={addr_repr(local[0], local[1])}, "
                f"remote={addr_repr(remote[0], remote[1])})")
    except OSError:
        return f"SocketImpl(fd={sock.fileno()})"


def _bind_source(sock: socket.socket, source_ip: str | None) -> None:
    """Simulator liberty (module docstring): the node's own address as the source, if local."""
    if not source_ip:
        return
    try:
        sock.bind((source_ip, 0))
    except OSError:
        pass


# --- the client side --------------------------------------------------------------------------

_last_not_listening_log: float | None = None


def _socket_connect(host: str, port: int, timeout_s: float, backoff: ExponentialBackoffWithJitter,
                    log: TorchLog, source_ip: str | None) -> socket.socket:
    """SocketConnectOp::run / tryConnect (torch/csrc/distributed/c10d/socket.cpp)."""
    global _last_not_listening_log
    timeout_ms = int(timeout_s * 1000)

    def timed_out() -> BaseException:
        msg = (f"The client socket has timed out after {timeout_ms}ms while trying to connect "
               f"to ({host}, {port}).")
        log.error("socket.cpp", 1028, msg)
        err = DistNetworkError(msg)
        err.where = "throwTimeoutError at /pytorch/torch/csrc/distributed/c10d/socket.cpp:1030"
        return err

    # prefer_ipv6 (the default): the IPv6 family first, v4-mapped (observed debug line)
    log.debug("socket.cpp", 785,
              f"The client socket will attempt to connect to an IPv6 address of ({host}, {port}).")
    deadline = time.monotonic() + timeout_s
    errors: list[str] = []
    while True:
        retry = False
        errors.clear()
        try:
            infos = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)
        except socket.gaierror as exc:
            msg = (f"The network addresses of ({host}, {port}) cannot be retrieved (gai error: "
                   f"{exc.errno} - {exc.strerror}).")
            log.warning("socket.cpp", 848, msg)  # line not observed
            errors.append(msg)
            infos, retry = [], True
        for family, kind, proto, _, sockaddr in infos:
            if time.monotonic() >= deadline:
                raise timed_out()
            shown = addr_repr(sockaddr[0], sockaddr[1])
            log.trace("socket.cpp", 859, f"The client socket is attempting to connect to {shown}.")
            sock = socket.socket(family, kind, proto)
            _bind_source(sock, source_ip)
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            try:
                sock.connect(sockaddr)
            except (ConnectionRefusedError, ConnectionResetError) as exc:
                sock.close()
                log.trace("socket.cpp", 931, f"The server socket on {shown} is not yet listening "
                          f"(errno: {exc.errno} - {os.strerror(exc.errno)}), will retry.")
                retry = True
                continue
            except TimeoutError:  # pollFd returned 0
                sock.close()
                raise timed_out() from None
            except OSError as exc:
                sock.close()
                if exc.errno == errno_mod.ETIMEDOUT:
                    log.warning("socket.cpp", 935,  # line not observed
                                f"The server socket on {shown} has timed out, will retry.")
                    retry = True
                    continue
                msg = (f"The client socket has failed to connect to {shown} "
                       f"(errno: {exc.errno} - {os.strerror(exc.errno or 0)}).")
                log.warning("socket.cpp", 942, msg)  # line not observed
                errors.append(msg)
                continue
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        if not retry:
            break
        delay_s = backoff.next_backoff_ms() / 1000
        now = time.monotonic()
        if now < deadline - delay_s:
            if _last_not_listening_log is None:
                _last_not_listening_log = now
            elif now - _last_not_listening_log >= _NOT_LISTENING_LOG_S:
                log.info("socket.cpp", 900,  # line not observed
                         f"No socket on ({host}, {port}) is listening yet, will retry.")
                _last_not_listening_log = now
            time.sleep(delay_s)
        else:
            raise timed_out()
    msg = f"The client socket has failed to connect to any network address of ({host}, {port})."
    log.error("socket.cpp", 818, msg)  # line not observed
    err = DistNetworkError(f"{msg} {' '.join(errors)}")
    err.where = "run at /pytorch/torch/csrc/distributed/c10d/socket.cpp:821"
    raise err


def store_client_connect(host: str, port: int, timeout_s: float, log: TorchLog,
                         source_ip: str | None = None) -> socket.socket:
    """TCPStore::TCPStore's client loop (torch/csrc/distributed/c10d/TCPStore.cpp)."""
    timeout_ms = int(timeout_s * 1000)
    deadline = time.monotonic() + timeout_s
    backoff = ExponentialBackoffWithJitter()
    attempt = 0
    while True:
        try:
            return _socket_connect(host, port, timeout_s, backoff, log, source_ip)
        except DistNetworkError as exc:
            where = raised_from(getattr(exc, "where", "connect"))
            if deadline < time.monotonic():
                log.error("TCPStore.cpp", 328,
                          f"TCP client failed to connect/validate to host {host}:{port} - timed "
                          f"out (try={attempt}, timeout={timeout_ms}ms): {exc}{where}")
                raise
            delay_ms = backoff.next_backoff_ms()
            log.warning("TCPStore.cpp", 340,
                        f"TCP client failed to connect/validate to host {host}:{port} - retrying "
                        f"(try={attempt}, timeout={timeout_ms}ms, delay={delay_ms}ms): {exc}{where}")
            time.sleep(delay_ms / 1000)
            attempt += 1


# --- a line-framed connection ------------------------------------------------------------------

class Conn:
    """JSON lines over one TCP connection; recv() returns None at EOF (or a reset)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buf = b""
        self._wlock = threading.Lock()
        self.closed = False

    def send(self, obj: dict[str, Any]) -> None:
        data = (json.dumps(obj) + "\n").encode()
        with self._wlock:
            self.sock.sendall(data)

    def recv(self, timeout_s: float | None = None) -> dict[str, Any] | None:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while b"\n" not in self._buf:
            if deadline is None:
                self.sock.settimeout(None)
            else:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("timed out")
                self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except (ConnectionResetError, BrokenPipeError, OSError) as exc:
                if isinstance(exc, TimeoutError):
                    raise
                return None
            if not chunk:
                return None
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return json.loads(line)

    def close(self) -> None:
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


# --- the master side ---------------------------------------------------------------------------

class StoreServer:
    """Rank 0's TCPStore daemon: listens on every local address at the port, counts the ranks
    that joined, answers the heartbeat checks; `on_message` gets every other message."""

    def __init__(self, port: int, on_message: Callable[[int, dict[str, Any], Conn], None]) -> None:
        self.port = port
        self.on_message = on_message
        self.joined: dict[int, dict[str, Any]] = {}  # rank -> its join message
        self.conns: dict[int, Conn] = {}
        self.count = 0  # the init key: every join adds one, as torch's counter
        self.cond = threading.Condition()
        self.closing = False
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # libuv does on bind
        try:
            self._sock.bind(("", port))
            self._sock.listen(128)
        except OSError as exc:
            self._sock.close()
            if exc.errno == errno_mod.EADDRINUSE:
                # TCPStoreLibUvBackend.cpp (text in torch 2.14.0's libtorch_cpu.so)
                raise DistNetworkError(
                    "The server socket has failed to listen on any local network address. "
                    f"port: {port}, useIpv6: false, code: -98, name: EADDRINUSE, "
                    "message: address already in use") from None
            raise DistNetworkError(
                "The server socket has failed to listen on any local network address. "
                f"port: {port}, useIpv6: false, code: {-(exc.errno or 0)}, name: "
                f"{errno_mod.errorcode.get(exc.errno or 0, '?')}, message: "
                f"{os.strerror(exc.errno or 0).lower()}") from None
        threading.Thread(target=self._accept, daemon=True, name="TCPStoreDaemon").start()

    def _accept(self) -> None:
        while not self.closing:
            try:
                sock, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(Conn(sock),), daemon=True).start()

    def _serve(self, conn: Conn) -> None:
        rank = -1
        while not self.closing:
            msg = conn.recv()
            if msg is None:
                self.on_message(rank, {"op": "eof"}, conn)
                return
            op = msg.get("op")
            if op == "join":
                rank = int(msg["rank"])
                try:
                    msg["peer"] = list(conn.sock.getpeername()[:2])
                except OSError:
                    msg["peer"] = ["?", 0]
                with self.cond:
                    self.count += 1
                    self.joined.setdefault(rank, msg)
                    self.conns.setdefault(rank, conn)
                    self.cond.notify_all()
            elif op == "check":  # the heartbeat monitor's store.check()
                try:
                    conn.send({"op": "checked"})
                except OSError:
                    return
            else:
                self.on_message(rank, msg, conn)

    def wait_for_workers(self, world_size: int, timeout_s: float) -> None:
        """TCPStore::waitForWorkers: whole seconds, `elapsed > timeout` (observed)."""
        start = time.monotonic()
        with self.cond:
            while self.count < world_size:
                elapsed = int(time.monotonic() - start)
                if elapsed > timeout_s:
                    raise DistStoreError(
                        f"Timed out after {elapsed} seconds waiting for clients. "
                        f"{self.count}/{world_size} clients joined.")
                self.cond.wait(0.01)

    def close(self) -> None:
        self.closing = True
        try:
            self._sock.close()
        except OSError:
            pass
        for conn in list(self.conns.values()):
            conn.close()


def heartbeat(conn: Conn, log: TorchLog, rank: int, store_host_gone_text: bool,
              stop: threading.Event) -> None:
    """The heartbeat monitor's store check, every HEARTBEAT_CHECK_S, forever (module docstring);
    once the master is gone, the warnings of every failed check (observed, torch 2.11.0)."""
    broken = False
    shown = socket_repr(conn.sock)  # while it is connected
    while not stop.wait(HEARTBEAT_CHECK_S):
        if not broken:
            try:
                conn.send({"op": "check"})
                reply = conn.recv()
            except OSError:
                reply = None
            if reply is not None:
                continue
            broken = True
            err = ("Failed to recv, got 0 bytes. Connection was likely closed. Did the remote "
                   "server shutdown or crash?")
            log.warning("TCPStore.cpp", 125, f"recvValue failed on {shown}: {err}"
                        + raised_from("recvBytes at /pytorch/torch/csrc/distributed/c10d/"
                                      "Utils.hpp:682"))
        else:
            err = "Broken pipe"
            log.warning("TCPStore.cpp", 106, f"sendBytes failed on {shown}: {err}"
                        + raised_from("sendBytes at /pytorch/torch/csrc/distributed/c10d/"
                                      "Utils.hpp:653"))
        if store_host_gone_text and log.enabled("W"):
            log.emit("W", "ProcessGroupNCCL.cpp", 1826,
                     f"[PG ID 0 PG GUID 0 Rank {rank}] Failed to check the \"should dump\" flag "
                     "on TCPStore, (maybe TCPStore server has shut down too early), with error: "
                     f"{err}")
