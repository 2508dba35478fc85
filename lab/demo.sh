#!/usr/bin/env bash
# `make demo` / `make demo-down`: the real program, through the real `pulumi` CLI, onto the lab.
#   lab/demo.sh up [NODES]   lab up → pulumi up --stack lab → endpoint, Ray's nodes, a chat
#                            (BACKEND=native: vLLM's own multi-node, no Ray; each node's rank)
#   lab/demo.sh down         pulumi destroy --stack lab → lab down
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
# shellcheck source=lab/env.sh
source lab/env.sh          # PATH with pulumi + providers, file backend under .lab/, no update checks
PY=.venv/bin/python
STACK=${SPARK_VLLM_STACK:-lab}
BACKEND=${BACKEND:-ray}

step() { echo; echo "==> $* ($(date +%T))"; }
t0=$(date +%s)
elapsed() { echo "$(( $(date +%s) - t0 )) s"; }

case "${1:-up}" in
up)
  nodes=${2:-2}
  step "lab: $nodes simulated DGX Spark nodes"
  $PY -m lab up --nodes "$nodes" --stack "$STACK" --backend "$BACKEND"
  step "pulumi stack $STACK (file backend: $PULUMI_BACKEND_URL)"
  pulumi stack select --create "$STACK" >/dev/null
  # Secrets go in through stdin, never argv; the lab makes its own SSH key and API key.
  pulumi config set --secret spark-vllm:sshPrivateKey < .lab/ssh/id_ed25519
  [ -s .lab/api-key ] || (umask 077; $PY -c "import secrets; print('sk-lab-' + secrets.token_hex(16))" > .lab/api-key)
  pulumi config set --secret spark-vllm:apiKey < .lab/api-key
  step "pulumi up --stack $STACK"
  pulumi up --yes --stack "$STACK" --skip-preview
  endpoint=$(pulumi stack output endpoint --stack "$STACK")
  model=$(pulumi stack output servedModelName --stack "$STACK")
  step "endpoint: $endpoint (model $model)"
  if [ "$BACKEND" = native ]; then
    step "backend native: one vLLM container per node (no Ray)"
    for i in $(seq 1 "$nodes"); do
      $PY -m lab ssh "node-$i" docker ps --filter "label=spark-vllm.stack=$STACK" \
        --format "node-$i {{.Names}} {{.Status}}"
    done
  else
  step "Ray's own node table (ray.nodes() on the head)"
  $PY -m lab ssh node-1 docker exec -i "spark-vllm-$STACK-ray-head" python3 - <<'PY'
import ray
ray.init(address="auto", logging_level="ERROR", log_to_driver=False)
print(f"{'NodeManagerAddress':<20}{'Alive':<7}GPU")
for n in sorted(ray.nodes(), key=lambda n: n["NodeManagerAddress"]):
    if n["Alive"]:
        print(f"{n['NodeManagerAddress']:<20}{str(n['Alive']):<7}{n['Resources'].get('GPU', 0):g}")
PY
  fi
  step "a chat completion through $endpoint"
  $PY - "$endpoint" "$model" <<'PY'
import json, sys, urllib.request
endpoint, model = sys.argv[1:3]
key = open(".lab/api-key").read().strip()
body = {"model": model, "messages": [{"role": "user", "content": "Hello from make demo"}],
        "max_tokens": 32}
req = urllib.request.Request(f"{endpoint}/chat/completions", data=json.dumps(body).encode(),
                             headers={"Content-Type": "application/json",
                                      "Authorization": f"Bearer {key}"})
with urllib.request.urlopen(req, timeout=60) as resp:
    reply = json.load(resp)
print("assistant:", reply["choices"][0]["message"]["content"])
PY
  step "done in $(elapsed); tear down with: make demo-down"
  echo "serving benchmark and live view (docs/operations.md):"
  echo "  source lab/env.sh && .venv/bin/spark-vllm bench --stack $STACK --profile quick"
  echo "  source lab/env.sh && .venv/bin/spark-vllm top --stack $STACK"
  ;;
down)
  if pulumi stack select "$STACK" >/dev/null 2>&1; then
    if [ -n "$($PY -m lab status 2>/dev/null | grep ' running ')" ]; then
      step "pulumi destroy --stack $STACK"
      pulumi destroy --yes --stack "$STACK" --skip-preview
    else
      # the nodes are already gone, so nothing is left to stop: forget the state
      step "lab is down: removing the stack's state (pulumi stack rm --force)"
      pulumi stack rm --force --yes --preserve-config "$STACK"
    fi
  fi
  step "lab down"
  $PY -m lab down
  step "done in $(elapsed)"
  ;;
*) echo "usage: $0 up [NODES] | down" >&2; exit 2 ;;
esac
