"""The bench's side of the peers (issue 50): which processes it takes for a vLLM rank, the
sparkrun contender's recipe and the report it reads, the peers' lock, and when a run is full.

No lab and no sparkrun here: the rank finder runs on this machine against processes this test
starts (listing only, signal 0), the recipe and timings are pure functions.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import ranks, sparkrun_env
from bench.contenders import sparkrun
from bench.stats import completeness

SLEEPER = "import time; time.sleep(60)"


def _fake(tmp_path: Path, exe_name: str, *args: str) -> subprocess.Popen:
    """A process whose argv reads like `<exe_name> <args>` (a python script named so)."""
    exe = tmp_path / exe_name
    exe.write_text(f"#!{sys.executable}\n{SLEEPER}\n")
    exe.chmod(0o755)
    return subprocess.Popen([str(exe), *args])


def _listed(pid: int) -> bool:
    out = subprocess.run([sys.executable, "-c", ranks.SIGNAL_RANKS_PY, "LIST"],
                         capture_output=True, text=True, timeout=30)
    return any(line.split()[0] == str(pid) for line in out.stdout.splitlines())


@pytest.fixture
def procs():
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        p.kill()
        p.wait(timeout=10)


def test_a_headless_vllm_serve_is_a_rank_and_the_api_server_is_not(tmp_path, procs):
    headless = _fake(tmp_path, "vllm", "serve", "/srv/m", "--nnodes", "2", "--node-rank", "1",
                     "--headless")
    head = _fake(tmp_path, "vllm-head", "serve", "/srv/m", "--nnodes", "2")
    other = _fake(tmp_path, "tool", "serve", "--headless")  # not vllm
    procs += [headless, head, other]
    time.sleep(0.5)
    assert _listed(headless.pid)
    assert not _listed(head.pid)
    assert not _listed(other.pid)


def test_a_ray_actor_titled_as_vllms_rank_is_a_rank(tmp_path, procs):
    # Ray titles an actor process `ray::<class>` in its argv (/proc/PID/cmdline)
    actor = subprocess.Popen(["bash", "-c", f"exec -a ray::RayWorkerProc {sys.executable} -c "
                                            f"'{SLEEPER}'"])
    idle = subprocess.Popen(["bash", "-c", f"exec -a ray::IDLE {sys.executable} -c '{SLEEPER}'"])
    procs += [actor, idle]
    time.sleep(0.5)
    assert _listed(actor.pid)
    assert not _listed(idle.pid)


def test_no_rank_exits_4_so_a_scenario_never_measures_a_fault_that_did_not_happen():
    # a pattern nothing on this machine matches: run the finder in a fresh PID view of names
    code = ranks.SIGNAL_RANKS_PY.replace("RayWorkerProc", "NoSuchRankClass9")
    out = subprocess.run([sys.executable, "-c", code, "LIST"], capture_output=True, text=True,
                         timeout=30)
    if out.returncode == 0:  # a real vLLM rank runs here (the CPU tier): nothing to assert
        assert all("--headless" in line for line in out.stdout.splitlines())
    else:
        assert out.returncode == 4 and out.stdout == ""


def test_sparkrun_recipe_carries_each_change_the_scenarios_make():
    base = sparkrun.recipe("WARN", None, 2)
    assert base["runtime"] == "vllm-distributed"  # its default path: native multi-node
    assert base["model"].startswith("/") and not base["model"].startswith("/root")
    assert base["env"] == {"NCCL_DEBUG": "WARN"}
    assert "--max-model-len" not in base["command"]
    assert base["defaults"]["tensor_parallel"] == 2
    assert base["executor_config"] == {"accelerator_vendor": "cpu", "privileged": False,
                                       "ulimit": []}
    changed = sparkrun.recipe("INFO", 8192, 4)
    assert changed["env"] == {"NCCL_DEBUG": "INFO"}
    assert changed["command"].endswith("--max-model-len 8192")
    assert changed["defaults"]["tensor_parallel"] == 4


def test_sparkrun_timings_are_read_from_its_own_report():
    out = ("[sparkrun] Inference ready at http://10.231.0.11:8000/v1\n"
           "  TTR HTTP-ready                                              9.193s\n"
           "Launch timings (total 18.0s):\n")
    assert sparkrun._timings(out) == {"sparkrun_total_s": 18.0,
                                      "container_to_http_ready_s": 9.193,
                                      "job_already_running": False}
    assert sparkrun._timings("Job already running (cluster_id: x)")["job_already_running"]


def test_the_gb10_shim_answers_sparkruns_three_queries_and_nothing_else(tmp_path):
    shim = tmp_path / "nvidia-smi"
    shim.write_text(sparkrun.SHIM_SH)
    shim.chmod(0o755)

    def ask(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(shim), *args], capture_output=True, text=True, timeout=10)

    assert ask("--query-gpu=name,memory.total", "--format=csv,noheader").stdout.strip() == \
        "NVIDIA GB10, [N/A]"
    assert ask("--query-gpu=compute_cap", "--format=csv,noheader").stdout.strip() == "12.1"
    assert ask("--query-gpu=driver_version", "--format=csv,noheader,nounits").returncode == 0
    # spark-vllm's own query (memory.total,memory.free) is not answered: the shim never
    # changes what spark-vllm measures, and it is only there during sparkrun's turn
    refused = ask("--query-gpu=memory.total,memory.free", "--format=csv,noheader,nounits")
    assert refused.returncode == 9 and refused.stdout == ""


def test_the_peers_lock_pins_every_wheel_by_hash():
    text = sparkrun_env.LOCK.read_text()
    reqs = [r for r in text.replace("\\\n", " ").splitlines()
            if r.strip() and not r.startswith("#")]
    assert any(r.startswith("sparkrun==0.4.2 ") for r in reqs)
    assert any(r.startswith("kvfit==0.3.0 ") for r in reqs)
    for r in reqs:
        name = r.split()[0]
        assert "==" in name, r
        assert "--hash=sha256:" in r, f"{name} has no hash"


def test_the_peers_venv_is_keyed_by_the_lock_and_lives_outside_the_repo(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    d = sparkrun_env.venv_dir()
    assert d.parent == tmp_path / "spark-vllm" / "bench"
    assert d.name.startswith("peers-")
    env = sparkrun_env.env()
    assert env["SPARKRUN_NO_TELEMETRY"] == "1"
    assert env["HOME"] != os.environ.get("HOME")


def test_fewer_than_three_runs_never_count_as_a_full_run():
    names = ["spark-vllm", "sparkrun"]
    assert completeness(None, names, names, False, 3) == (True, [])
    full, why = completeness(None, names, names, False, 1)
    assert not full and why == ["1 run(s), fewer than 3"]


def _rec(contender: str, scenario: str, seconds: float | None, ok: bool = True,
         note: str = "", run: int = 1) -> dict:
    return {"nodes": 2, "contender": contender, "scenario": scenario, "run": run,
            "seconds": seconds, "ok": ok, "note": note, "profile": {}, "restarts": None}


def test_the_targets_against_sparkrun_are_ratios_of_medians_and_repairs_counted():
    from bench import peers_report

    runs = [_rec("spark-vllm", "cold_up", 15.0), _rec("sparkrun", "cold_up", 20.0),
            _rec("spark-vllm", "env_change", 15.0), _rec("sparkrun", "env_change", 20.0),
            _rec("spark-vllm", "vllm_change", 8.0), _rec("sparkrun", "vllm_change", 20.0),
            _rec("spark-vllm", "rank_killed", 30.0),
            _rec("sparkrun", "rank_killed", None, ok=False, note="not serving 180 s after")]
    got = {t.name: t for t in peers_report.targets(runs)}
    cold = got["2 nodes, spark-vllm: cold up → serving ≤ 1.1 × sparkrun's"]
    assert cold.met and "0.75 ×" in cold.measured
    env = got["2 nodes, spark-vllm: env change → serving ≤ 0.6 × sparkrun's"]
    assert env.met is False and "0.75 ×" in env.measured  # missed: a real failure shows
    assert got["2 nodes, spark-vllm: vLLM-arg change → serving ≤ 0.6 × sparkrun's"].met
    killed = [t for k, t in got.items() if "killed" in k][0]
    assert killed.met and "1 of 1" in killed.measured and "sparkrun 0 of 1" in killed.measured
    notes = "\n".join(peers_report.notes_section(runs))
    assert "not serving 180 s after" in notes and "serving again in 0 of 1" in notes
