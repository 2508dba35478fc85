"""Where a result goes. Every run is `results/<stamp>.json`. A full run (stats.is_complete)
is also `results/latest.{json,md,png}` and the table in bench/README.md; a partial one (an
--only run, a subset of the contenders, an interrupted run) gets `<stamp>.{md,png}` beside its
JSON and never touches the full run's."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from bench import chart, report
from bench.common import REPO, dump_json
from bench.stats import is_complete

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
README = HERE / "README.md"
BEGIN, END = "<!-- bench-table:begin -->", "<!-- bench-table:end -->"


def write_outputs(result: dict[str, Any], stamp: str, *, results: Path = RESULTS,
                  readme: Path | None = README, write_json: bool = True) -> Path:
    """Write a result where it belongs (see the module); the markdown's path. write_json
    false: the stamp's JSON is the source itself (--report), left as it is."""
    results.mkdir(parents=True, exist_ok=True)
    if write_json:
        dump_json(results / f"{stamp}.json", result)
    if not is_complete(result):
        md = results / f"{stamp}.md"
        md.write_text(report.markdown(result))
        chart.chart(result, results / f"{stamp}.png")
        return md
    dump_json(results / "latest.json", result)
    md = results / "latest.md"
    md.write_text(report.markdown(result))
    chart.chart(result, results / "latest.png")
    if readme is not None:
        write_readme(result, shown(results / f"{stamp}.json"), readme)
    return md


def stamp_of(result: dict[str, Any], path: Path) -> str:
    """The stamp a result was written under: its own (recorded since), the file's name, or,
    for a copy (latest.json), the stamp of the run file holding the same result, or its date."""
    if result.get("stamp"):
        return str(result["stamp"])
    if path.stem != "latest":
        return path.stem
    text = path.read_text()
    for other in sorted(path.parent.glob("*.json"), reverse=True):
        if other.name != path.name and other.read_text() == text:
            return other.stem
    date = result.get("machine", {}).get("date")
    if date:
        return time.strftime("%Y%m%dT%H%M%SZ", time.strptime(date, "%Y-%m-%dT%H:%M:%SZ"))
    return "report"


def write_readme(result: dict[str, Any], source: str, readme: Path = README) -> None:
    """The README's table block, from `result` (named `source` in it); nothing else of the
    file changes."""
    block = [BEGIN, "<!-- written by `python -m bench` (a full run) and `python -m bench "
             "--readme`: edit bench/report.py's readme_table, not this -->",
             *report.readme_table(result, source), END]
    readme.write_text(splice(readme.read_text(), "\n".join(block)))


def splice(text: str, block: str) -> str:
    """`text` with the block between the markers replaced by `block` (markers included);
    without markers, `block` goes after the first code block (the command list)."""
    if BEGIN in text and END in text.split(BEGIN, 1)[1]:
        head, rest = text.split(BEGIN, 1)
        return head + block + rest.split(END, 1)[1]
    fences = [i for i, line in enumerate(text.splitlines(keepends=True))
              if line.startswith("```")]
    lines = text.splitlines(keepends=True)
    at = fences[1] + 1 if len(fences) >= 2 else len(lines)
    return "".join(lines[:at]) + "\n" + block + "\n" + "".join(lines[at:])


def readme_from_latest(results: Path = RESULTS, readme: Path = README) -> str:
    """`--readme`: the table again from results/latest.json; the file it names."""
    latest = results / "latest.json"
    result = json.loads(latest.read_text())
    source = shown(results / f"{stamp_of(result, latest)}.json")
    if not (results / Path(source).name).exists():
        source = shown(latest)
    write_readme(result, source, readme)
    return source


def written(result: dict[str, Any], md: Path) -> str:
    """What write_outputs wrote, in a line."""
    if is_complete(result):
        return f"wrote {shown(md.with_suffix(''))}.{{json,md,png}} and bench/README.md's table"
    why = "; ".join(result.get("incomplete") or [f"--only {result['config'].get('only')}"])
    return (f"wrote {shown(md.with_suffix(''))}.{{md,png}}: a partial run ({why}), "
            "latest.* left as they are")


def shown(path: Path) -> str:
    """A path as the README names it: from the repository's root where it lies inside."""
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return path.name
