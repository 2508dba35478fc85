#!/usr/bin/env bash
# Make sure a Docker engine answers on this host. If `docker info` fails, start `dockerd` in the
# background (no systemd here), log to /var/log/spark-vllm-dockerd.log, and wait until it is
# ready (bounded: DOCKERD_WAIT seconds, default 60), printing progress.
set -euo pipefail

LOG=${SPARK_VLLM_DOCKERD_LOG:-/var/log/spark-vllm-dockerd.log}
WAIT=${DOCKERD_WAIT:-60}

if docker info >/dev/null 2>&1; then
  echo "dockerd: already running ($(docker version -f '{{.Server.Version}}' 2>/dev/null))"
  exit 0
fi

command -v dockerd >/dev/null || { echo "dockerd: not installed (run lab/system-deps.sh)" >&2; exit 1; }

# A stale pid file from a killed daemon makes the new one refuse to start.
if [ -f /var/run/docker.pid ] && ! kill -0 "$(cat /var/run/docker.pid)" 2>/dev/null; then
  rm -f /var/run/docker.pid
fi

if ! pgrep -x dockerd >/dev/null; then
  echo "dockerd: starting (log: $LOG)"
  # setsid: detach from this shell's process group so it outlives the caller. The subshell
  # closes every descriptor above 2 that the caller passed on: dockerd keeps what it inherits
  # for its whole life, so a caller's lock or pipe (a CI harness waiting for its EOF, a
  # `flock` wrapper) would otherwise stay held until the daemon ends.
  (
    for fd in /proc/$BASHPID/fd/*; do
      fd=${fd##*/}
      [ "$fd" -gt 2 ] && eval "exec $fd>&-"
    done
    exec setsid nohup dockerd >>"$LOG" 2>&1 </dev/null
  ) &
else
  echo "dockerd: a dockerd process exists but does not answer yet; waiting"
fi

start=$(date +%s)
while ! docker info >/dev/null 2>&1; do
  now=$(date +%s); el=$((now - start))
  if [ "$el" -ge "$WAIT" ]; then
    echo "dockerd: not ready after ${WAIT}s; last log lines:" >&2
    tail -n 20 "$LOG" >&2 || true
    exit 1
  fi
  if [ $((el % 5)) -eq 0 ]; then echo "dockerd: waiting… ${el}s"; fi
  sleep 1
done
echo "dockerd: ready after $(( $(date +%s) - start ))s ($(docker version -f '{{.Server.Version}}' 2>/dev/null))"
