"""Streamed answers: server-sent events as vLLM's stream generator sends them, one chunk per
engine step (vllm/entrypoints/openai/chat_completion/serving.py, 0.26.0)."""

from __future__ import annotations

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
                  chat: bool, field_name: str = "content",
                  token_ids: bool = False) -> AsyncIterator[str]:
    """Server-sent events as vLLM's stream generator sends them: the role's chunk, then one
    chunk per engine step that gave the request tokens (that step's text, and with
    `return_token_ids` its token ids: vllm/entrypoints/openai/chat_completion/serving.py,
    0.26.0), then the finish chunk with the usage. The canned text is cut into the tokens'
    texts (repeated past its end: pieces), and a request cut short by max_tokens gets the
    rest of the text in its last step (the text stays whole). An engine
    failure after the 200 is an error event, then [DONE] (as vLLM's
    create_streaming_error_response)."""
    obj = "chat.completion.chunk" if chat else "text_completion"
    state = engine.state

    def chunk(choice: dict[str, Any], with_usage: bool = False) -> str:
        payload: dict[str, Any] = {
            "id": rid,
            "object": obj,
            "created": created,
            "model": model,
            "choices": [choice],
        }
        if with_usage:
            payload["usage"] = usage
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
                {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
            )
        while True:
            try:
                n = await engine.next_tokens(req)
            except RuntimeError:
                yield error_event()
                return
            if n is None:
                break
            last = sent + n >= completion_tokens
            piece = "".join(parts[sent:] if last else parts[sent:sent + n])
            choice: dict[str, Any] = ({"index": 0, "delta": {field_name: piece}} if chat
                                      else {"index": 0, "text": piece})
            choice["finish_reason"] = None
            if token_ids:
                choice["token_ids"] = [1000 + i for i in range(sent, sent + n)]
            sent += n
            yield chunk(choice)
        state.success_total += 1
        state.prompt_tokens_total += prompt_tokens
        if chat:
            yield chunk({"index": 0, "delta": {}, "finish_reason": "stop"}, with_usage=True)
        else:
            yield chunk({"index": 0, "text": "", "finish_reason": "stop"}, with_usage=True)
        yield "data: [DONE]\n\n"
    finally:
        state.running -= 1
        if not req.done.done():  # the client went away mid-stream
            engine.abort(req)


def error_event() -> str:
    body = {"error": {"message": ENGINE_ERROR, "type": "InternalServerError", "param": None,
                      "code": 500}}
    return f"data: {json.dumps(body)}\n\ndata: [DONE]\n\n"
