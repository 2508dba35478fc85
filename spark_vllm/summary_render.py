"""The summary as a reviewer reads it (spark_vllm/summary.py): the headline, the what-restarts
line, the markdown table of a PR comment and the text of a terminal."""

from __future__ import annotations

import html
import re

from .summary_model import (
    CHECKS,
    COPY,
    CREATE,
    DELETE,
    HEAD,
    IMAGE_COPY,
    KEEP,
    MODEL,
    PROGRAM_CAUSES,
    RANK,
    REPLACE,
    UPDATE,
    VLLM,
    WORKER,
    Summary,
)


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _ranks_stop(nodes: list[str]) -> str:
    return (f"vLLM's headless rank{'s stop' if len(nodes) > 1 else ' stops'} on "
            f"{', '.join(nodes)}")


def headline(s: Summary, markdown: bool = False) -> str:
    """One line: what restarts, loudest first."""
    def loud(text: str) -> str:
        return f"**{text}**" if markdown else text

    if s.errors:
        return loud("The preview failed") + ": no plan, so nothing is known about restarts."
    if s.is_noop:
        return "No change: nothing restarts."
    parts = []
    if (v := s.vllm) and v.action != UPDATE:  # an update keeps it: said below
        what = {REPLACE: "vLLM reloads the model", CREATE: "vLLM loads the model",
                DELETE: "vLLM stops"}.get(v.action, "vLLM changes in place")
        # what the program owns that vLLM runs, said here: no config line of the PR shows it
        why = [c for c in v.causes if c.startswith(PROGRAM_CAUSES)] \
            if v.action == REPLACE else []
        parts.append(f"{loud(what)} ({v.node})" + (f": {'; '.join(why)}" if why else ""))
    if switch := s.backend_switch:
        parts.insert(0, loud(f"The backend changes from {switch[0]} to {switch[1]}")
                     + ": every container is replaced, the old ones stopped on every node first")
    ranks: list[str] = []  # a new node's rank starts (as a Ray worker does): it never ran
    if restarted_ranks := s.rank_nodes(REPLACE):
        ranks.append(f"vLLM's headless ranks restart on {', '.join(restarted_ranks)}")
    if new_ranks := s.rank_nodes(CREATE):
        ranks.append(f"vLLM's headless rank{'s start' if len(new_ranks) > 1 else ' starts'} on "
                     f"{', '.join(new_ranks)}")
    parts += [f"{ranks[0]} (no Ray)", *ranks[1:]] if ranks else []
    if restarted := s.ray_nodes(REPLACE):
        parts.append(f"Ray restarts on {_count(len(restarted), 'node')}")
    if started := s.ray_nodes(CREATE):
        parts.append(f"Ray starts on {', '.join(started)}")
    if stopped := s.ray_nodes(DELETE):
        parts.append(f"Ray stops on {', '.join(stopped)}")
    if gone := s.rank_nodes(DELETE):
        parts.append(_ranks_stop(gone))
    if images := s.copied_to(IMAGE_COPY):
        parts.append(f"the head's image is copied to {', '.join(images)}")
    if copies := s.copied_to(COPY):
        parts.append(f"the model is copied to {', '.join(copies)}")
    elif any(r.role == MODEL and r.action in (CREATE, REPLACE) for r in s.changed()):
        parts.append("the model is staged again on the head")
    if parts and not (restarted or started or stopped) and not s.native:
        parts.append("Ray keeps running")
    rotated = s.key_rotated
    if parts and rotated:
        parts.append(f"the apiKey is rotated in place ({rotated.node})")
    if not parts:
        checks = [r for r in s.changed() if r.role in CHECKS]
        if rotated:
            return (f"Nothing restarts: the apiKey is rotated in place (its file on "
                    f"{rotated.node}; the API server reads it at its next request)"
                    + ("; checks run again." if checks else "."))
        if [r for r in s.changed() if r.action == UPDATE and r.role in (HEAD, WORKER, RANK, VLLM)]:
            return ("Nothing restarts: every container is kept (updated in place)"
                    + ("; checks run again." if checks else "."))
        return ("Nothing restarts: only checks run again." if checks else
                f"Nothing restarts: {_count(s.other_changes, 'resource')} change in place.")
    return " · ".join(parts)


_VLLM_SAYS = {REPLACE: "yes (reloads the model: minutes of downtime on a Spark)",
              CREATE: "yes (loads the model: minutes on a Spark)",
              DELETE: "stops (the endpoint is gone)", UPDATE: "no (changes in place)"}


def what_restarts(s: Summary) -> str:
    ray = s.ray_nodes(REPLACE, CREATE)
    ranks = s.rank_nodes(REPLACE, CREATE)
    if s.native:
        line = (f"What restarts (backend native, no Ray): vLLM's headless ranks on "
                f"{_count(len(ranks), 'node')} ({', '.join(ranks)})" if ranks else
                "What restarts (backend native, no Ray): no headless rank")
    else:
        line = (f"What restarts: Ray on {_count(len(ray), 'node')} ({', '.join(ray)})" if ray
                else "What restarts: Ray on no node")
    v = s.vllm
    line += f"; vLLM: {_VLLM_SAYS.get(v.action, 'yes') if v else 'no'}."
    if stopped := s.ray_nodes(DELETE):
        line += f" Ray stops on {', '.join(stopped)}."
    if gone := s.rank_nodes(DELETE):
        line += f" {_ranks_stop(gone)}."
    if switch := s.backend_switch:
        line += (f" The backend changes from {switch[0]} to {switch[1]}: each node's preflight "
                 f"stops the {switch[0]} backend's containers there before any new one starts.")
    if images := s.copied_to(IMAGE_COPY):
        line += (f" The head's image copied to {', '.join(images)} (only the layers they lack; "
                 "nothing where a node holds its id).")
    if copies := s.copied_to(COPY):
        line += f" Weights copied to {', '.join(copies)} (only the files they lack)."
    if rotated := s.key_rotated:
        line += (f" The apiKey's file on {rotated.node} is written in place: no container "
                 "restarts for it.")
    if s.compile_cache:
        line += " " + s.compile_cache
    return line


_CONFIG_CHANGE = re.compile(r"^(?:--)?[A-Za-z][\w.@\[\]-]*: ")  # a key or a vLLM flag


def _md_cell(text: str, code: bool = False) -> str:
    if not text:
        return "–"
    if code:
        fence = "``" if "`" in text else "`"
        cell = f"{fence} {text} {fence}" if fence == "``" else f"`{text}`"
    else:
        cell = html.escape(text, quote=False)
    return cell.replace("|", "\\|")


def render_markdown(s: Summary) -> str:
    lines = [f"### spark-vllm preview: stack `{s.stack}`", ""] if s.stack else []
    lines.append(headline(s, markdown=True))
    if s.errors:
        for err in s.errors:
            fence = "````" if "```" in err else "```"
            lines += ["", fence, err, fence]
        return "\n".join(lines) + "\n"
    if s.is_noop:
        return "\n".join(lines) + "\n"
    lines += ["", "| node | role | action | cause | consequence |", "|---|---|---|---|---|"]
    for r in s.rows:
        cause = "<br>".join(_md_cell(c, code=bool(_CONFIG_CHANGE.match(c))) for c in r.causes)
        action = r.action if r.action == KEEP else f"**{r.action}**"
        lines.append(f"| {_md_cell(r.node)} | {_md_cell(r.role)} | {action} | {cause or '–'} "
                     f"| {_md_cell(r.consequence)} |")
    lines += ["", what_restarts(s)]
    return "\n".join(lines) + "\n"


def render_text(s: Summary) -> str:
    lines = [f"stack {s.stack}: {headline(s)}" if s.stack else headline(s)]
    if s.errors:
        return "\n".join([*lines, "", *s.errors]) + "\n"
    if s.is_noop:
        return lines[0] + "\n"
    table = [("NODE", "ROLE", "ACTION", "CAUSE", "CONSEQUENCE")]
    table += [(r.node, r.role, r.action, r.cause or "-", r.consequence or "-") for r in s.rows]
    widths = [max(len(row[i]) for row in table) for i in range(4)]
    lines.append("")
    for row in table:
        lines.append("  ".join([*(c.ljust(w) for c, w in zip(row, widths, strict=False)),
                                row[4]]).rstrip())
    lines += ["", what_restarts(s)]
    return "\n".join(lines) + "\n"
