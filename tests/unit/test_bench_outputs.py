"""bench's outputs (bench/outputs.py, chart.py, report.py's README table): a partial run writes
its own files beside the full run's and never over them, a full run writes latest.* and the
README's table (between its markers, nothing else of the README touched), every contender has
a colour of its own, and a contender or scenario the bench does not know yet is shown, not a
crash. (tests/unit/test_bench_report.py is the serving bench's, spark_vllm/bench_report.py.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench import chart, outputs, report
from bench.__main__ import main
from bench.stats import CONTENDERS, completeness, contenders_of, is_complete, stat

REPO = Path(__file__).resolve().parents[2]
README_TEXT = """# bench

```
make bench
.venv/bin/python -m bench --quick
```

Results: prose someone wrote.

## What runs

More prose, with a ``` fence later:

```
not the command list
```
"""


def record(nodes: int, contender: str, scenario: str, run: int, seconds: float | None,
           ok: bool = True, **extra: Any) -> dict[str, Any]:
    changed = None if scenario in ("cold_up", "teardown", "join_failure") else {
        "containers_started": 1, "ray_containers_started": 0, "ray_restarted_nodes": 0,
        "vllm_restarted": True, "started": ["spark-vllm-bench-vllm"]}
    return {"nodes": nodes, "contender": contender, "scenario": scenario, "run": run,
            "seconds": seconds, "ok": ok, "note": "" if ok else "not repaired within 120 s",
            "profile": {}, "restarts": changed, **extra}


def result(contenders: list[str], scenarios: list[str], only: str | None = None,
           complete: bool | None = None, runs: int = 2) -> dict[str, Any]:
    recs = []
    for n in (2, 4):
        for c in contenders:
            for s in scenarios:
                for r in range(1, runs + 1):
                    if s == "join_failure" and c in ("launcher", "bare"):
                        recs.append(record(n, c, s, r, None, cap_s=60))
                    elif s == "rank_killed" and c == "bare":
                        recs.append(record(n, c, s, r, None, ok=False, cap_s=120))
                    else:
                        recs.append(record(n, c, s, r, 10.0 + r + len(c)))
    out: dict[str, Any] = {
        "machine": {"date": "2026-12-31T10:00:00Z", "commit": "abc1234", "nproc": 2,
                    "mem_gib": 8, "kernel": "k", "docker": "d", "ray": "r", "pulumi": "p",
                    "engine": "e", "python": "3.11"},
        "config": {"runs": runs, "nodes": [2, 4], "contenders": contenders, "only": only,
                   "join_cap_s": 60, "ray_timeout_s": 60, "stack": "bench"},
        "runs": recs, "preview": [], "staging": []}
    if complete is not None:
        out["complete"] = complete
        out["incomplete"] = [] if complete else [f"--only {only}"]
    return out


FIVE = ["spark-vllm", "spark-vllm-native", "launcher", "bare", "sparkrun"]
NINE = ["cold_up", "noop", "env_change", "vllm_change", "worker_reboot", "teardown",
        "join_failure", "rank_killed", "incident"]


@pytest.fixture
def place(tmp_path: Path) -> tuple[Path, Path]:
    """A results directory holding a full run's latest.*, and a README with the command list."""
    results = tmp_path / "results"
    results.mkdir()
    for name in ("latest.json", "latest.md", "latest.png"):
        (results / name).write_text(f"the full run's {name}\n")
    readme = tmp_path / "README.md"
    readme.write_text(README_TEXT)
    return results, readme


def test_a_partial_run_writes_beside_the_full_runs_outputs_never_over_them(
        place: tuple[Path, Path]) -> None:
    results, readme = place
    partial = result(["spark-vllm", "bare"], ["cold_up"], only="cold_up", complete=False)
    md = outputs.write_outputs(partial, "20261231T100000Z", results=results, readme=readme)
    assert md == results / "20261231T100000Z.md"
    for name in ("latest.json", "latest.md", "latest.png"):
        assert (results / name).read_text() == f"the full run's {name}\n"
    assert readme.read_text() == README_TEXT
    assert json.loads((results / "20261231T100000Z.json").read_text()) == partial
    assert "spark-vllm (pulumi up)" in md.read_text()
    assert (results / "20261231T100000Z.png").read_bytes()[:4] == b"\x89PNG"


def test_a_full_run_writes_latest_and_the_readme_table(place: tuple[Path, Path]) -> None:
    results, readme = place
    full = result(FIVE, NINE, complete=True)
    md = outputs.write_outputs(full, "20261231T100000Z", results=results, readme=readme)
    assert md == results / "latest.md"
    assert json.loads((results / "latest.json").read_text()) == full
    assert (results / "20261231T100000Z.json").exists()
    assert (results / "latest.png").read_bytes()[:4] == b"\x89PNG"
    assert not (results / "20261231T100000Z.md").exists()
    text = readme.read_text()
    block = text.split(outputs.BEGIN, 1)[1].split(outputs.END, 1)[0]
    assert "20261231T100000Z.json" in block and "`abc1234`" in block
    assert "sparkrun 0.4.2" in block and "spark-vllm / sparkrun" in block
    assert "rank on node-2 killed → serving" in block
    # the bare path never reported the join failure within 60 s: the ratio is a bound
    assert "> 60 (not reported)" in block and "< 0." in block
    assert "> 120 (not repaired)" in block


def test_an_old_result_is_full_iff_it_ran_without_only() -> None:
    assert is_complete(result(["spark-vllm"], ["cold_up"]))
    assert not is_complete(result(["spark-vllm"], ["cold_up"], only="cold_up"))
    # a result that says, says
    assert not is_complete(result(FIVE, ["cold_up"], complete=False))


def test_full_needs_no_only_every_default_contender_and_no_interrupt() -> None:
    defaults = ["spark-vllm", "launcher", "bare", "sparkrun"]
    assert completeness(None, defaults, defaults, False) == (True, [])
    ok, why = completeness("noop", ["spark-vllm", "bare"], defaults, True)
    assert not ok and why == ["--only noop", "without launcher, sparkrun", "interrupted"]
    # more than the defaults is still full
    assert completeness(None, [*defaults, "spark-vllm-native"], defaults, False)[0]


def test_the_readme_block_is_replaced_between_its_markers_and_nothing_else_changes(
        tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(README_TEXT)
    outputs.write_readme(result(FIVE, NINE), "r1.json", readme)
    first = readme.read_text()
    # the first time, right after the command list, as a paragraph of its own
    head, rest = first.split(outputs.BEGIN, 1)
    body, tail = rest.split(outputs.END, 1)
    assert head == README_TEXT.split("Results:")[0]
    assert first.replace(f"\n{outputs.BEGIN}{body}{outputs.END}\n", "", 1) == README_TEXT
    # again: only the block changes
    outputs.write_readme(result(["spark-vllm", "bare"], ["cold_up"]), "r2.json", readme)
    second = readme.read_text()
    assert second.split(outputs.BEGIN)[0] == head
    assert second.split(outputs.END)[1] == tail
    assert "r2.json" in second and "r1.json" not in second
    assert second.count(outputs.BEGIN) == second.count(outputs.END) == 1


def test_each_contender_has_its_own_colour_whoever_else_ran() -> None:
    names = [*CONTENDERS, "mystery", "other"]
    got = chart.colors(names)
    assert len(set(got.values())) == len(names)
    for c in CONTENDERS:
        assert chart.colors([c])[c] == got[c] == chart.COLORS[c]
    many = [f"tool-{i}" for i in range(20)]
    assert len(set(chart.colors(many).values())) == 20


def test_an_unknown_contender_and_scenario_are_shown_not_a_crash(tmp_path: Path) -> None:
    res = result([*FIVE, "mystery"], [*NINE, "brand_new"], complete=True)
    assert contenders_of(res) == [*FIVE, "mystery"]
    md = report.markdown(res)
    assert "| sparkrun 0.4.2 | mystery |" in md
    assert "| brand_new |" in md
    table = "\n".join(report.readme_table(res, "x.json"))
    assert "spark-vllm / mystery" in table and "| brand_new |" in table
    chart.chart(res, tmp_path / "u.png")
    assert (tmp_path / "u.png").stat().st_size > 10_000


def test_not_repaired_within_the_cap_is_said_so() -> None:
    st = stat([record(2, "bare", "rank_killed", r, None, ok=False, cap_s=120) for r in (1, 2)])
    assert st is not None
    assert st.cell(scenario="rank_killed") == "> 120 (not repaired, 2 runs)"
    assert st.short(scenario="rank_killed") == "> 120 (not repaired)"
    # elsewhere a failure is a failure
    assert st.cell(scenario="cold_up") == "failed (2)"


def test_the_stamp_of_latest_json_is_the_run_file_holding_the_same_result(
        tmp_path: Path) -> None:
    res = result(["spark-vllm"], ["cold_up"])
    for name in ("20261130T221415Z.json", "latest.json"):
        (tmp_path / name).write_text(json.dumps(res))
    assert outputs.stamp_of(res, tmp_path / "latest.json") == "20261130T221415Z"
    assert outputs.stamp_of(res, tmp_path / "20261130T221415Z.json") == "20261130T221415Z"
    assert outputs.stamp_of({**res, "stamp": "X"}, tmp_path / "latest.json") == "X"


def test_report_of_a_partial_json_leaves_latest_alone(place: tuple[Path, Path],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    results, readme = place
    monkeypatch.setattr("bench.__main__.RESULTS", results)
    monkeypatch.setattr("bench.__main__.README", readme)
    src = results / "20261203T220034Z.json"
    src.write_text(json.dumps(result(["spark-vllm", "bare"], ["cold_up"], only="cold_up")))
    assert main(["--report", str(src)]) == 0
    assert (results / "20261203T220034Z.md").exists()
    assert (results / "20261203T220034Z.png").exists()
    assert (results / "latest.md").read_text() == "the full run's latest.md\n"
    assert readme.read_text() == README_TEXT
    full = results / "20261130T221415Z.json"
    full.write_text(json.dumps(result(FIVE, ["cold_up"])))
    assert main(["--report", str(full)]) == 0
    assert "spark-vllm benchmark results" in (results / "latest.md").read_text()
    assert "20261130T221415Z.json" in readme.read_text()
    assert not (results / "20261130T221415Z.md").exists()


def test_the_committed_readme_table_is_latest_jsons() -> None:
    """bench/README.md's table is generated from the committed full run: after a new
    latest.json, `python -m bench --readme` writes it again."""
    latest = REPO / "bench" / "results" / "latest.json"
    res = json.loads(latest.read_text())
    assert is_complete(res), "latest.json must be a full run"
    text = (REPO / "bench" / "README.md").read_text()
    block = text.split(outputs.BEGIN, 1)[1].split(outputs.END, 1)[0]
    source = f"bench/results/{outputs.stamp_of(res, latest)}.json"
    assert "\n".join(report.readme_table(res, source)) in block, \
        "bench/README.md's table is stale: run `.venv/bin/python -m bench --readme`"
