# spark-vllm. Two commands matter:  `make demo` (the lab, end to end) and `make test`.
SHELL := /bin/bash
PY    := .venv/bin/python
NODES ?= 2
BACKEND ?= ray

.PHONY: help venv tools deps test unit lint demo demo-down bench lab-up lab-down fidelity captures

help:
	@echo "make demo       lab up (simulated Spark nodes) + pulumi up + a chat completion (BACKEND=native: no Ray)"
	@echo "make demo-down  pulumi destroy + lab down"
	@echo "make test       venv from scratch + every test (unit, simulator, real engine on the lab)"
	@echo "make unit       fast tests only (no Docker, no engine)"
	@echo "make bench      benchmarks against Ray's cluster launcher and the bare path"

# The virtualenv Pulumi's language host runs the program in (Pulumi.yaml: virtualenv .venv).
.venv/.ready: requirements.txt requirements-dev.txt pyproject.toml lab/vllm_sim/pyproject.toml
	@echo "[make] creating .venv (cold: ~2 min, mostly Ray)"
	python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	@# Bytecode for every module, made here, in parallel: pip's own (serial) compile took 27 s
	@# of a fresh install. It must be made here: where PYTHONDONTWRITEBYTECODE is set (CI's
	@# machine sets it) Python never writes a .pyc, and each of the suite's thousands of Python
	@# starts (the program, the language host, the command provider per `pulumi up`) compiled
	@# its imports again: 1.5 s against 0.7 s per program start, and the lab suite 3047 s
	@# against 2255 s (2026-12-03). compileall -j0: 16 s on 2 cores.
	$(PY) -m pip install -q --no-compile -r requirements-dev.txt
	$(PY) -m compileall -q -j0 .venv/lib >/dev/null
	touch $@

venv: .venv/.ready

# The real Pulumi engine (CLI, language host, command provider), built once and cached.
tools:
	bash lab/tools.sh >/dev/null

# Host packages and a running Docker engine (the lab's nodes are containers).
deps:
	bash lab/system-deps.sh
	bash lab/dockerd.sh

unit: venv
	$(PY) -m pytest -q tests/unit

lint: venv
	.venv/bin/ruff check spark_vllm components tests __main__.py lab bench
	.venv/bin/mypy
	@# the PR-preview workflow ships in the template (spark-vllm init writes it): lint it where it lands
	d=$$(mktemp -d) && mkdir -p $$d/.github/workflows && cp spark_vllm/template/preview.yml $$d/.github/workflows/ && \
	  (cd $$d && "$$(bash $(CURDIR)/lab/actionlint.sh | tail -n 1)" .github/workflows/preview.yml); rc=$$?; rm -rf $$d; exit $$rc

test: venv tools
	bash lab/test.sh

demo: venv tools deps
	BACKEND=$(BACKEND) bash lab/demo.sh up $(NODES)

demo-down: venv tools
	bash lab/demo.sh down

bench: venv tools deps
	$(PY) -m bench

lab-up: venv deps
	$(PY) -m lab up --nodes $(NODES)

lab-down: venv
	$(PY) -m lab down

# the PR-summary tests' preview captures, made again from today's program (ray and native)
captures: venv tools deps
	bash lab/captures.sh

# vllm-sim's flag table against the real vLLM source (downloads the wheel once; not in CI)
fidelity: venv
	bash lab/vllm_sim/fidelity.sh
