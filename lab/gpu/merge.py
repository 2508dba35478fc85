"""Merge the runner's per-part files into one observations file per vLLM version.

    python3 lab/gpu/merge.py OUT.json RUN=PART_FILE [RUN=PART_FILE ...] [--note TEXT]
        [--into MERGED.json --call N]

The header is the first part's (machine, GPU, versions, date, commit) plus each run's own date,
commit and part; runs keep their scenarios as recorded. `--into` adds the runs to an already
merged file (its header and runs kept; a run of the same name is refused), each new run's
header entry with `call` N (the device call it was recorded in) and its own machine fields
where they differ from the merged header's.
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


MACHINE = ("vllm", "ray", "python", "torch", "transformers", "gpu", "kernel", "cpus")


def merge_into(base: dict, pairs: list[tuple[str, Path]], call: int, note: str = "") -> dict:
    out = json.loads(json.dumps(base))
    for run, path in pairs:
        if run in out["runs"]:
            raise SystemExit(f"merge: run {run!r} is already in the merged file")
        d = json.loads(path.read_text())
        entry = {k: d["header"].get(k) for k in ("part", "date", "commit")}
        entry["call"] = call
        entry.update({k: d["header"].get(k) for k in MACHINE
                      if d["header"].get(k) != out["header"].get(k)})
        out["header"]["runs"][run] = entry
        out["runs"][run] = {"scenarios": d["scenarios"]}
    if note:
        out["header"]["note"] = note
    return out


def main(argv: list[str]) -> None:
    opts: dict[str, str] = {}
    for flag in ("--note", "--into", "--call"):
        if flag in argv:
            i = argv.index(flag)
            opts[flag], argv = argv[i + 1], argv[:i] + argv[i + 2:]
    out, pairs = Path(argv[0]), [(a.split("=", 1)[0], Path(a.split("=", 1)[1])) for a in argv[1:]]
    if "--into" in opts:
        merged = merge_into(json.loads(Path(opts["--into"]).read_text()), pairs,
                            int(opts["--call"]), opts.get("--note", ""))
    else:
        merged = merge(pairs, opts.get("--note", ""))
    out.write_text(json.dumps(merged, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
