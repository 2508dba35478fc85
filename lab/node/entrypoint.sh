#!/bin/bash
# Entrypoint of a simulated DGX Spark node (PID 2, under tini).
# Env (set by lab/cluster.py):
#   LAB_FABRIC_IP        address docker gave this node on the fabric network
#   LAB_FABRIC_IFNAME    name to give that interface (default enp1s0f1np1, the Spark's RoCE port)
#   LAB_FABRIC_SPARE_IP  extra address on the same interface (tests that move a node's identity)
#   LAB_DOCKER_BIP       --bip of the inner dockerd, distinct per node (e.g. 172.31.1.1/24)
# Copied in before the first start (`docker cp`, no bind mount: the lab must not depend on
# the path of the repo that made it): /lab/ssh/{ssh_host_ed25519_key,authorized_keys}
# Writes /run/lab-node-ready when sshd and dockerd both answer.
set -euo pipefail
log() { echo "lab-node: $*"; }

IFNAME=${LAB_FABRIC_IFNAME:-enp1s0f1np1}
rm -f /run/lab-node-ready
# A reboot (`python -m lab reboot`, or any `docker restart` of the node) keeps the node's
# filesystem, /run included, which a real host's tmpfs /run does not: the previous boot's pid
# files and containerd state would stop dockerd ("pid file found") or containerd ("timeout").
# Clear the runtime state as a boot does; /var/lib/docker (containers, images) stays, so the
# stack's containers are found stopped, as on a rebooted Spark.
rm -rf /run/docker.pid /run/docker /run/containerd /run/sshd.pid

# 1. Emulated --privileged (plain --privileged fails on the lab VM, whose root lacks
#    CAP_SYS_RESOURCE: lab/nodes.py, docs/development.md): docker mounts /sys and the cgroup
#    hierarchies read-only unless --privileged; the inner dockerd/runc need them writable.
#    The cgroup v1 hierarchies are read-only *bind* mounts of the node's own cgroup: a plain
#    remount fails ("mount point is busy"), `remount,bind,rw` flips the bind's flag.
remount_rw() {
  mount -o remount,rw "$1" 2>/dev/null || mount -o remount,bind,rw "$1" 2>/dev/null \
    || log "warning: cannot remount $1 rw"
}
remount_rw /sys
if mountpoint -q /sys/fs/cgroup; then remount_rw /sys/fs/cgroup; fi
for h in /sys/fs/cgroup/*; do
  if mountpoint -q "$h"; then remount_rw "$h"; fi
done
if [ -e /sys/fs/cgroup/cpuset ] && ! touch /sys/fs/cgroup/cpuset 2>/dev/null; then
  log "warning: cgroups still read-only: inner containers will not start"
fi

# 2. Fabric interface: give the interface holding LAB_FABRIC_IP the Spark's RoCE name.
if [ -n "${LAB_FABRIC_IP:-}" ]; then
  dev=""
  for _ in $(seq 1 50); do
    dev=$(ip -o -4 addr show | awk -v ip="$LAB_FABRIC_IP" '{split($4, a, "/"); if (a[1] == ip) print $2}' | head -n1)
    [ -n "$dev" ] && break
    sleep 0.1
  done
  if [ -z "$dev" ]; then log "error: no interface holds $LAB_FABRIC_IP"; ip -o addr show; exit 1; fi
  if [ "$dev" != "$IFNAME" ]; then
    ip link set dev "$dev" down
    ip link set dev "$dev" name "$IFNAME"
    ip link set dev "$IFNAME" up
  fi
  if [ -n "${LAB_FABRIC_SPARE_IP:-}" ]; then
    prefix=$(ip -o -4 addr show dev "$IFNAME" | awk -v ip="$LAB_FABRIC_IP" '{split($4, a, "/"); if (a[1] == ip) print a[2]}')
    ip addr replace "$LAB_FABRIC_SPARE_IP/${prefix:-24}" dev "$IFNAME"
  fi
  log "fabric: $(ip -o -4 addr show dev "$IFNAME" | awk '{print $4}' | tr '\n' ' ')on $IFNAME"
fi

# 3. sshd with the lab's host key and authorized key.
install -m 0600 /lab/ssh/ssh_host_ed25519_key /etc/ssh/ssh_host_ed25519_key
install -m 0600 /lab/ssh/authorized_keys /root/.ssh/authorized_keys
install -m 0600 -o aurora -g aurora /lab/ssh/authorized_keys /home/aurora/.ssh/authorized_keys
mkdir -p /run/sshd
/usr/sbin/sshd -E /var/log/sshd.log

# 4. Inner dockerd on the /var/lib/docker volume (overlay2 not stacked on overlay).
dockerd --storage-driver overlay2 ${LAB_DOCKER_BIP:+--bip "$LAB_DOCKER_BIP"} \
  >>/var/log/dockerd.log 2>&1 &
dockerd_pid=$!

stop() {
  log "stopping"
  # dockerd stops the inner containers first (10 s each at most): `lab reboot` allows 25 s
  kill -TERM "$dockerd_pid" 2>/dev/null || true
  for _ in $(seq 1 240); do kill -0 "$dockerd_pid" 2>/dev/null || break; sleep 0.1; done
  [ -f /run/sshd.pid ] && kill "$(cat /run/sshd.pid)" 2>/dev/null || true
  exit 0
}
trap stop TERM INT

t0=$(date +%s%N)
for _ in $(seq 1 600); do
  if docker info >/dev/null 2>&1 && timeout 1 bash -c '</dev/tcp/127.0.0.1/22' 2>/dev/null; then
    touch /run/lab-node-ready
    ms=$(( ($(date +%s%N) - t0) / 1000000 ))
    log "ready (sshd + dockerd) after ${ms} ms"
    break
  fi
  if ! kill -0 "$dockerd_pid" 2>/dev/null; then
    log "error: dockerd exited"; tail -n 30 /var/log/dockerd.log; exit 1
  fi
  sleep 0.1
done
[ -f /run/lab-node-ready ] || { log "error: not ready after 600 tries"; tail -n 30 /var/log/dockerd.log; exit 1; }

# 5. Stay up (tini reaps orphans); wake on TERM.
sleep infinity &
wait $!
