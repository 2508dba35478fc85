"""The estimator section's markdown (bench/estimators.py): a table of available KV, one of KV
tokens, one of admissions, the summary per tool and what each tool cannot express."""

from __future__ import annotations

from typing import Any

TOOLS = ("spark-vllm", "kvfit", "sparkrun")


def _num(x: float | None, fmt: str) -> str:
    return "—" if x is None else format(x, fmt)


def _err(x: float | None) -> str:
    return "" if x is None else f" ({x:+.1f} %)"


def _short(rid: str) -> str:
    """The recording's id without its fixture's common prefix."""
    return rid.replace("vllm-0.26.0-", "").replace("vllm-0.26.0:", "tiny:")


def _flags(r: dict[str, Any]) -> str:
    out = [f"u {r['utilization']}", f"len {r['max_model_len'] or 'auto'}"]
    if r["max_num_seqs"]:
        out.append(f"seqs {r['max_num_seqs']}")
    if r["max_num_batched_tokens"]:
        out.append(f"batch {r['max_num_batched_tokens']}")
    if r["kv_cache_dtype"] != "auto":
        out.append(f"kv {r['kv_cache_dtype']}")
    return ", ".join(out)


def _stat_cells(s: dict[str, Any]) -> str:
    if not s.get("n"):
        return "— | — | — | —"
    return (f"{s['n']} | {s['median_abs_pct']:.2f} % | {s['min_pct']:+.1f} … {s['max_pct']:+.1f} %"
            f" | {s['within_1pct']}")


def markdown(result: dict[str, Any]) -> str:
    rows, summ, v, m = result["rows"], result["summary"], result["versions"], result["machine"]
    lines = [
        "# Memory admission against the peers' estimators",
        "",
        f"Run {m['date']} at commit `{m['commit']}`: spark-vllm {v['spark-vllm']} "
        f"(components/memory_estimate.py, Python {m['python']}), kvfit {v['kvfit']} and "
        f"sparkrun {v['sparkrun']} (PyPI, their own functions, Python {v['python']}), against "
        f"real vLLM {v['vllm (recorded)']} on one H200 (tests/fixtures/real-vllm/: "
        f"{len(rows)} recordings, TP 1). Every tool is given the same model config, checkpoint "
        "size, GPU total (CUDA's, what vLLM budgets from) and the flags it can express. Errors "
        "are signed: (tool - vLLM) / vLLM; above 0 the tool promises memory vLLM did not give.",
        "",
        "## Summary",
        "",
        "| tool | what | n | median abs error | min … max error | within 1 % |",
        "|---|---|--:|--:|--:|--:|",
    ]
    for t in TOOLS:
        lines.append(f"| {t} | available KV | {_stat_cells(summ[t]['available'])} |")
        lines.append(f"| {t} | KV tokens | {_stat_cells(summ[t]['tokens'])} |")
    fixtures = list(summ[TOOLS[0]]["available_by_fixture"])
    lines += ["", "Available KV by recording file (median abs error; min … max error):", "",
              "| tool | " + " | ".join(f.rsplit("/", 1)[-1] for f in fixtures) + " |",
              "|---|" + "--:|" * len(fixtures)]
    for t in TOOLS:
        by = summ[t]["available_by_fixture"]
        lines.append(f"| {t} | " + " | ".join(
            f"{by[f]['median_abs_pct']:.2f} % ({by[f]['min_pct']:+.1f} … {by[f]['max_pct']:+.1f} %)"
            if by[f].get("n") else "—" for f in fixtures) + " |")
    lines += ["", "| tool | admitted, vLLM refused | refused, vLLM started | no estimate |",
              "|---|---|---|---|"]
    for t in TOOLS:
        s = summ[t]
        cells = [", ".join(_short(i) for i in s[k]) or "none" for k in (
            "admitted_but_vllm_refused", "refused_but_vllm_started", "no_estimate")]
        lines.append(f"| {t} | " + " | ".join(cells) + " |")
    lines += ["", "## Available KV cache (GiB)", "",
              "| recording | set | flags | vLLM | " + " | ".join(TOOLS) + " |",
              "|---|---|---|--:|" + "--:|" * len(TOOLS)]
    for r in rows:
        cells = [_num(r["tools"][t]["available_gib"], ".2f") + _err(
            r["tools"][t]["err_available_pct"]) for t in TOOLS]
        lines.append(f"| {_short(r['id'])} | {r['set']} | {_flags(r)} | "
                     f"{_num(r['vllm']['available_gib'], '.2f')} | " + " | ".join(cells) + " |")
    lines += ["", "## KV cache tokens", "", "| recording | vLLM | " + " | ".join(TOOLS) + " |",
              "|---|--:|" + "--:|" * len(TOOLS)]
    for r in rows:
        cells = [_num(r["tools"][t]["tokens"], ",d") + _err(r["tools"][t]["err_tokens_pct"])
                 for t in TOOLS]
        lines.append(f"| {_short(r['id'])} | {_num(r['vllm']['tokens'], ',d')} | "
                     + " | ".join(cells) + " |")
    lines += ["", "## Admission", "",
              "| recording | vLLM | " + " | ".join(TOOLS) + " |", "|---|---|" + "---|" * len(TOOLS)]
    for r in rows:
        vl = r["vllm"]["outcome"] + (f": {r['vllm']['refusal']}" if r["vllm"]["refusal"] else "")
        cells = []
        for t in TOOLS:
            x = r["tools"][t]
            mark = " **(vLLM refused)**" if x["admitted_refused"] else (
                " **(vLLM started)**" if x["refused_started"] else "")
            cells.append(("admits" if x["admits"] else "refuses") + mark)
        lines.append(f"| {_short(r['id'])} | {vl} | " + " | ".join(cells) + " |")
    lines += ["", "## What each tool cannot express", ""]
    for t in TOOLS:
        lines.append(f"- **{t}**: " + "; ".join(result["cannot_express"][t]) + ".")
    lines += [
        "",
        "Notes: \"set\" is whether spark-vllm's measured constants were fitted on the recording "
        "or it was recorded after them (held out); the peers were fitted on none. The free "
        "memory at start is recorded only in the real-scale file; elsewhere it is the total, as "
        "the tests take it (only spark-vllm reads it). KV tokens with --max-model-len auto: "
        "vLLM's at the length it chose; spark-vllm's at the longest length it admits; kvfit's "
        "at max_position_embeddings; sparkrun's from its budget alone. kvfit's tokens are its "
        "sequences before the floor x the context (planner.py floors them to whole "
        "sequences). Raw outputs of every tool: the JSON beside this file.",
        "",
    ]
    return "\n".join(lines)
