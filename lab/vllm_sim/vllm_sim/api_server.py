"""The OpenAI-compatible surface of `vllm serve`, with canned, deterministic answers.

Shapes follow vLLM: /health is open and answers 200 while the engine lives, 503 once it is
dead (vllm/entrypoints/serve/instrumentator/health.py); with an API key every /v1 path needs
`Authorization: Bearer <key>` and otherwise gets 401 {"error": "Unauthorized"}; an unknown
`model` gets 404 "The model `X` does not exist.".
"""

import asyncio
import hmac
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from vllm_sim import VLLM_VERSION
from vllm_sim.logger import init_logger

logger = init_logger(__name__)


@dataclass
class ServerState:
    served_model_name: str
    model: str
    tensor_parallel_size: int
    pipeline_parallel_size: int
    rank_ips: list[str]  # Ray node address of each rank, in rank order
    max_model_len: int | None = None
    api_key: str | None = None
    # Called off the event loop; True while the engine's ranks answer.
    check_health: Callable[[], bool] = lambda: True
    created: int = field(default_factory=lambda: int(time.time()))
    running: int = 0
    success_total: int = 0
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0


def _error(message: str, err_type: str, code: int, param: str | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": err_type, "param": param, "code": code}}
    return JSONResponse(body, status_code=code)


def _count_tokens(text: str) -> int:
    # Whitespace words stand in for tokens: deterministic, and good enough for usage fields.
    return len(text.split())


def _message_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return " ".join(
            p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""


def build_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="vllm-sim", version=VLLM_VERSION)

    @app.middleware("http")
    async def authentication(request: Request, call_next):  # type: ignore[no-untyped-def]
        if state.api_key and request.method != "OPTIONS" and request.url.path.startswith("/v1"):
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {state.api_key}".encode()):
                return JSONResponse({"error": "Unauthorized"}, status_code=401)
        return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(str(exc.errors()), "BadRequestError", 400)

    async def engine_alive() -> bool:
        return await asyncio.to_thread(state.check_health)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200 if await engine_alive() else 503)

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": VLLM_VERSION}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card: dict[str, Any] = {
            "id": state.served_model_name,
            "object": "model",
            "created": state.created,
            "owned_by": "vllm",
            "root": state.model,
            "parent": None,
        }
        if state.max_model_len is not None:
            card["max_model_len"] = state.max_model_len
        return {"object": "list", "data": [card]}

    def _check_model(body: dict[str, Any]) -> JSONResponse | None:
        name = body.get("model")
        if name is None or name == state.served_model_name:
            return None
        return _error(f"The model `{name}` does not exist.", "NotFoundError", 404, "model")

    def _answer(said: str) -> str:
        return (
            "vllm-sim (simulator, no inference): "
            f"TP={state.tensor_parallel_size} PP={state.pipeline_parallel_size} "
            f"ranks on {', '.join(state.rank_ips)} \u2014 you said: {said}"
        )

    async def _read_json(request: Request) -> dict[str, Any] | JSONResponse:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error("Request body is not valid JSON.", "BadRequestError", 400)
        if not isinstance(body, dict):
            return _error("Request body must be a JSON object.", "BadRequestError", 400)
        return body

    async def _complete(body: dict[str, Any], said: str, prompt_text: str, chat: bool) -> Response:
        if (bad := _check_model(body)) is not None:
            return bad
        if not await engine_alive():
            return _error(
                "EngineCore encountered an issue. See stack trace (above) for the root cause.",
                "InternalServerError",
                500,
            )
        state.running += 1
        try:
            text = _answer(said)
            prompt_tokens = _count_tokens(prompt_text)
            completion_tokens = _count_tokens(text)
            state.success_total += 1
            state.prompt_tokens_total += prompt_tokens
            state.generation_tokens_total += completion_tokens
        finally:
            state.running -= 1
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        model = state.served_model_name
        created = int(time.time())
        if chat:
            rid, obj = f"chatcmpl-{uuid.uuid4().hex}", "chat.completion"
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": "stop",
            }
        else:
            rid, obj = f"cmpl-{uuid.uuid4().hex}", "text_completion"
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "stop"}
        if body.get("stream"):
            return StreamingResponse(
                _stream(rid, created, model, text, usage, chat), media_type="text/event-stream"
            )
        return JSONResponse(
            {
                "id": rid,
                "object": obj,
                "created": created,
                "model": model,
                "choices": [choice],
                "usage": usage,
            }
        )

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        body = await _read_json(request)
        if isinstance(body, JSONResponse):
            return body
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return _error("`messages` must be a non-empty list.", "BadRequestError", 400)
        user_texts = [
            _message_text(m.get("content"))
            for m in messages
            if isinstance(m, dict) and m.get("role") == "user"
        ]
        prompt = " ".join(_message_text(m.get("content")) for m in messages if isinstance(m, dict))
        return await _complete(body, user_texts[-1] if user_texts else "", prompt, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await _read_json(request)
        if isinstance(body, JSONResponse):
            return body
        prompt = body.get("prompt", "")
        if isinstance(prompt, list):
            prompt = " ".join(str(p) for p in prompt)
        return await _complete(body, str(prompt), str(prompt), chat=False)

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        labels = f'engine="0",model_name="{state.served_model_name}"'
        lines = [
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{{{labels}}} {float(state.running)}",
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{{{labels}}} 0.0",
            "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f"vllm:kv_cache_usage_perc{{{labels}}} 0.0",
            "# HELP vllm:request_success_total Count of successfully processed requests.",
            "# TYPE vllm:request_success_total counter",
            f"vllm:request_success_total{{{labels}}} {float(state.success_total)}",
            "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.",
            "# TYPE vllm:prompt_tokens_total counter",
            f"vllm:prompt_tokens_total{{{labels}}} {float(state.prompt_tokens_total)}",
            "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
            "# TYPE vllm:generation_tokens_total counter",
            f"vllm:generation_tokens_total{{{labels}}} {float(state.generation_tokens_total)}",
            "# HELP vllm_sim_info This server is vllm-sim, a simulator: it does no inference.",
            "# TYPE vllm_sim_info gauge",
            f'vllm_sim_info{{version="{VLLM_VERSION}",'
            f'tensor_parallel_size="{state.tensor_parallel_size}",'
            f'pipeline_parallel_size="{state.pipeline_parallel_size}"}} 1.0',
        ]
        return PlainTextResponse(
            "\n".join(lines) + "\n", media_type="text/plain; version=0.0.4; charset=utf-8"
        )

    return app


async def _stream(rid: str, created: int, model: str, text: str, usage: dict[str, int], chat: bool):  # type: ignore[no-untyped-def]
    obj = "chat.completion.chunk" if chat else "text_completion"

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

    if chat:
        yield chunk(
            {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
        )
        yield chunk({"index": 0, "delta": {"content": text}, "finish_reason": None})
        yield chunk({"index": 0, "delta": {}, "finish_reason": "stop"}, with_usage=True)
    else:
        yield chunk({"index": 0, "text": text, "finish_reason": None})
        yield chunk({"index": 0, "text": "", "finish_reason": "stop"}, with_usage=True)
    yield "data: [DONE]\n\n"
