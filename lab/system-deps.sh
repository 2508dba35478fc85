#!/usr/bin/env bash
# Host packages the lab needs (Debian 12). Idempotent: returns at once when all are installed.
#   docker.io     dockerd + containerd for the lab's node containers (Docker-in-Docker)
#   debootstrap   builds the Debian base image (no registry is reachable from the lab machine)
#   openssh-client, rsync   reaching the nodes as a Spark is reached
#   iproute2, iptables, curl, ca-certificates   networks, checks, and the CA bundle for pip
#   openssh-server  the sshd binary for tests/engine (the command-provider stand-in's conformance
#                   tests run a private sshd on loopback; the system service is NOT started:
#                   policy-rc.d refuses it during the install)
set -euo pipefail

#   make          the Makefile (make test, make demo)
#   shellcheck    actionlint checks the PR workflow's `run:` scripts with it (tests/toolchain)
#   python3-venv  only when the python3 on PATH is Debian's and cannot make a venv without it
PKGS=(docker.io debootstrap openssh-client openssh-server iproute2 iptables rsync curl ca-certificates make
      shellcheck)
if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then PKGS+=(python3-venv); fi

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "system-deps: all present (${PKGS[*]})"
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
echo "system-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
# no daemon may start from a package's postinst (dockerd is started by lab/dockerd.sh):
# policy-rc.d exit 101 = "action forbidden"
policy=/usr/sbin/policy-rc.d
own_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null && $SUDO chmod 0755 "$policy"
  own_policy=1
fi
rc=0
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" || rc=$?
[ "$own_policy" = 1 ] && $SUDO rm -f "$policy"
[ "$rc" = 0 ] || exit "$rc"
echo "system-deps: done"
