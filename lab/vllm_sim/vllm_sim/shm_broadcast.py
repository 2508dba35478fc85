"""V2 mode: the driver <-> rank control channel (vLLM 0.33.0 MessageQueue), on real sockets.

What is reproduced (vllm/distributed/device_communicators/shm_broadcast.py):
- A queue with local readers creates a /dev/shm segment (ShmRingBuffer, :347-352) and BINDS an
  `ipc://` socket at `get_open_zmq_ipc_path()` = `ipc://{VLLM_RPC_BASE_PATH}/{uuid4()}`
  (vllm/utils/network_utils.py:175-177; VLLM_RPC_BASE_PATH defaults to tempfile.gettempdir(),
  vllm/envs.py:732-734) in the WRITER's process (:542-544). Remote readers get a TCP socket on
  `connect_ip` (:563-576). The handle carries the path string, the shm name and the TCP address.
- A reader (`create_from_handle`, :622-685) opens the shm by name (FileNotFoundError is
  swallowed, :373-377: it only fails later, on first use) and CONNECTS to the path string as
  given, in its own process and hence its own filesystem. ZMQ's connect never fails for a
  missing path: its I/O thread retries in the background (ZMQ_RECONNECT_IVL, 100 ms), silently.
- `wait_until_ready` (:688-719): the writer waits for one subscription per reader with a
  blocking recv() - no timeout, no log - then sends b"READY"; a reader waits for b"READY".

So a reader that cannot see the writer's path blocks its writer forever, without a word.
Simplifications: one ipc path per queue (vLLM binds a second one for SpinCondition
notifications, :549-552); a 64 KiB segment instead of VLLM_MQ_MAX_CHUNK_BYTES_MB x 10 chunks;
a byte stream (Unix/TCP socket) instead of ZMQ XPUB/SUB.
"""

import os
import socket
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from multiprocessing import shared_memory
from unittest.mock import patch

from vllm_sim.logger import init_logger
from vllm_sim.network_utils import get_ip

logger = init_logger(__name__)

SHM_BYTES = 64 * 1024
RECONNECT_INTERVAL_S = 0.1  # libzmq's default ZMQ_RECONNECT_IVL
_SUBSCRIBE, _READY = b"SUB\n", b"READY\n"


def rpc_base_path() -> str:
    # vllm/envs.py:732-734, read lazily (envs.__getattr__, :2293-2301): a rank sees the value
    # its environment has at the time, i.e. after the driver's env was carried over.
    return os.getenv("VLLM_RPC_BASE_PATH", tempfile.gettempdir())


def get_open_zmq_ipc_path() -> str:
    return f"ipc://{rpc_base_path()}/{uuid.uuid4()}"


@dataclass
class Handle:
    local_reader_ranks: list[int] = field(default_factory=list)
    shm_name: str | None = None
    local_subscribe_addr: str | None = None
    remote_subscribe_addr: str | None = None


def _recv_line(conn: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(64)
        if not chunk:
            raise ConnectionError("peer closed the message queue")
        data += chunk
    return data


class MessageQueue:
    """Writer side, or a reader built by create_from_handle."""

    def __init__(self, n_reader: int, n_local_reader: int, connect_ip: str | None = None):
        self.n_local_reader = n_local_reader
        self.n_remote_reader = n_reader - n_local_reader
        self.is_writer = True
        self.shm: shared_memory.SharedMemory | None = None
        self._local_listener: socket.socket | None = None
        self._remote_listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._ipc_file: str | None = None
        handle = Handle(local_reader_ranks=list(range(n_local_reader)))
        if n_local_reader > 0:
            self.shm = shared_memory.SharedMemory(create=True, size=SHM_BYTES)
            handle.shm_name = self.shm.name
            addr = get_open_zmq_ipc_path()
            self._ipc_file = addr.removeprefix("ipc://")
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(self._ipc_file)
            listener.listen(n_local_reader)
            self._local_listener = listener
            handle.local_subscribe_addr = addr
        if self.n_remote_reader > 0:
            ip = connect_ip or get_ip()
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.bind((ip, 0))
            listener.listen(self.n_remote_reader)
            self._remote_listener = listener
            handle.remote_subscribe_addr = f"tcp://{ip}:{listener.getsockname()[1]}"
        self.handle = handle
        logger.debug("vLLM message queue communication handle: %s", handle)

    def export_handle(self) -> Handle:
        return self.handle

    @staticmethod
    def create_from_handle(handle: Handle, rank: int) -> "MessageQueue":
        self = MessageQueue.__new__(MessageQueue)
        self.is_writer = False
        self.handle = handle
        self.shm = None
        self._conns = []
        self._local_listener = self._remote_listener = None
        self._ipc_file = None
        self.is_local_reader = rank in handle.local_reader_ranks
        if self.is_local_reader:
            # Python tracks segments it merely opened and would unlink them at exit
            # (vLLM patches the tracker the same way, :361-365).
            with patch("multiprocessing.resource_tracker.register", lambda *a, **k: None):
                try:
                    self.shm = shared_memory.SharedMemory(name=handle.shm_name)
                except FileNotFoundError:
                    pass  # as vLLM: fails only on first use
            addr = handle.local_subscribe_addr
        else:
            addr = handle.remote_subscribe_addr
        self._connected = threading.Event()
        self._conn: socket.socket | None = None
        threading.Thread(
            target=self._connect_forever, args=(addr,), daemon=True, name="mq-connect"
        ).start()
        return self

    def _connect_forever(self, addr: str) -> None:
        """libzmq's background connect: retry silently until the peer is there."""
        while True:
            if addr.startswith("ipc://"):
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                target: object = addr.removeprefix("ipc://")
            else:
                host, port = addr.removeprefix("tcp://").rsplit(":", 1)
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                target = (host.strip("[]"), int(port))
            try:
                sock.connect(target)  # type: ignore[arg-type]
                sock.sendall(_SUBSCRIBE)
            except OSError:
                sock.close()
                time.sleep(RECONNECT_INTERVAL_S)
                continue
            self._conn = sock
            self._connected.set()
            return

    @property
    def shm_attached(self) -> bool:
        return self.shm is not None

    def wait_until_ready(self) -> None:
        """Blocks without a bound, as vLLM's (a collective: writer and all readers call it)."""
        if self.is_writer:
            for listener, n in (
                (self._local_listener, self.n_local_reader),
                (self._remote_listener, self.n_remote_reader),
            ):
                for _ in range(n):
                    assert listener is not None
                    conn, _ = listener.accept()
                    if _recv_line(conn) != _SUBSCRIBE:
                        raise RuntimeError("unexpected message on the message queue")
                    self._conns.append(conn)
            for conn in self._conns:
                conn.sendall(_READY)
        else:
            self._connected.wait()
            assert self._conn is not None
            if _recv_line(self._conn) != _READY:
                raise RuntimeError("unexpected message on the message queue")

    def wait_closed(self) -> None:
        """A reader's busy loop: block until the writer goes away."""
        assert self._conn is not None
        while self._conn.recv(4096):
            pass

    def remove_writer_files(self) -> None:
        """Reader side: unlink the (dead) writer's socket file and segment, where visible."""
        addr = self.handle.local_subscribe_addr
        if addr and addr.startswith("ipc://"):
            try:
                os.unlink(addr.removeprefix("ipc://"))
            except OSError:
                pass
        if self.shm is not None:
            # Not ours in Python's resource tracker (see create_from_handle).
            with patch("multiprocessing.resource_tracker.unregister", lambda *a, **k: None):
                try:
                    self.shm.unlink()
                except OSError:
                    pass

    def close(self) -> None:
        for s in [*self._conns, self._local_listener, self._remote_listener,
                  getattr(self, "_conn", None)]:
            if s is not None:
                try:
                    s.close()
                except OSError:
                    pass
        if self._ipc_file:
            try:
                os.unlink(self._ipc_file)
            except OSError:
                pass
        if self.shm is not None:
            try:
                self.shm.close()
                if self.is_writer:
                    self.shm.unlink()
            except (OSError, BufferError):
                pass
