"""Merge the runner's per-part files into one observations file per vLLM version.

    python3 lab/gpu/merge.py OUT.json RUN=PART_FILE [RUN=PART_FILE ...] [--note TEXT]

The header is the first part's (machine, GPU, versions, date, commit) plus each run's own date,
commit and part; runs keep their scenarios as recorded.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def merge(pairs: list[tuple[str, Path]], note: str = "") -> dict:
    runs = {run: json.loads(path.read_text()) for run, path in pairs}
    first = next(iter(runs.values()))["header"]
    header = {k: v for k, v in first.items() if k not in ("part", "date", "commit")}
    header["runs"] = {run: {k: d["header"].get(k) for k in ("part", "date", "commit")}
                      for run, d in runs.items()}
    if note:
        header["note"] = note
    return {"header": header, "runs": {run: {"scenarios": d["scenarios"]}
                                       for run, d in runs.items()}}


def main(argv: list[str]) -> None:
    note = ""
    if "--note" in argv:
        i = argv.index("--note")
        note, argv = argv[i + 1], argv[:i] + argv[i + 2:]
    out, pairs = Path(argv[0]), [(a.split("=", 1)[0], Path(a.split("=", 1)[1])) for a in argv[1:]]
    out.write_text(json.dumps(merge(pairs, note), indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
