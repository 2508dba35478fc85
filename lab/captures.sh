#!/usr/bin/env bash
# `make captures`: the PR-summary tests' preview documents (tests/fixtures/previews/, native/
# for backend native), made again from today's program in one command:
#   lab up (2 nodes) → pulumi up → python -m lab.capture_previews (every change kind)
#   → backend native → pulumi up → the same kinds into native/ → destroy → lab down.
# The lab suite checks them (test_lifecycle, test_native: `capture_previews --check`): a program
# whose plan for a kind no longer matches its capture fails there, naming the kind.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
# shellcheck source=lab/env.sh
source lab/env.sh
PY=.venv/bin/python
STACK=lab
OUT=tests/fixtures/previews
t0=$(date +%s)
step() { echo "==> $* ($(( $(date +%s) - t0 )) s)"; }

step "lab: 2 nodes"
$PY -m lab up --nodes 2 --stack "$STACK" --model-size 512M -q
pulumi stack select --create "$STACK" >/dev/null
pulumi config set --secret spark-vllm:sshPrivateKey < .lab/ssh/id_ed25519
[ -s .lab/api-key ] || (umask 077; $PY -c "import secrets; print('sk-lab-' + secrets.token_hex(16))" > .lab/api-key)
pulumi config set --secret spark-vllm:apiKey < .lab/api-key
trap 'step "tearing down"; pulumi destroy --yes --stack "$STACK" --skip-preview >/dev/null || true; $PY -m lab down -q || true' EXIT

step "backend ray: pulumi up"
pulumi up --yes --stack "$STACK" --skip-preview >/dev/null
step "backend ray: capturing"
$PY -m lab.capture_previews --stack "$STACK" --out "$OUT"

step "backend native: pulumi up"
pulumi config set spark-vllm:backend native --stack "$STACK"
pulumi up --yes --stack "$STACK" --skip-preview >/dev/null
step "backend native: capturing"
$PY -m lab.capture_previews --stack "$STACK" --out "$OUT/native"
pulumi config rm spark-vllm:backend --stack "$STACK"
step "done: git diff --stat $OUT"
