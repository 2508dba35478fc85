"""The node's end of copyTransport tcp for the image copy (scripts/image_copy.py sends it to the
node as `python3 - IP`): listens on the node's identity address for one connection, which must
first send the one-time token this prints, then pipes the rest into `docker load -q` (quiet:
its progress output cost 3.5 s of 14 on the lab). Prints "listening PORT TOKEN" first; exits
with docker load's code."""

import secrets
import socket
import subprocess
import sys

ip = sys.argv[1]
srv = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET)
srv.bind((ip, 0))
srv.listen(1)
srv.settimeout(60)
token = secrets.token_hex(16)
print("listening", srv.getsockname()[1], token, flush=True)
conn, _ = srv.accept()
conn.settimeout(600)
got = b""
while len(got) < len(token):
    part = conn.recv(len(token) - len(got))
    if not part:
        sys.exit("the sender closed before its token")
    got += part
if got.decode(errors="replace") != token:
    sys.exit("a connection without the copy's token: refused")
load = subprocess.Popen(["docker", "load", "-q"], stdin=subprocess.PIPE)
assert load.stdin
while True:
    data = conn.recv(1 << 20)
    if not data:
        break
    load.stdin.write(data)
load.stdin.close()
sys.exit(load.wait())
