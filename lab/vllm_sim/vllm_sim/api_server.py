"""The OpenAI-compatible surface of `vllm serve`, with canned, deterministic answers.

Shapes follow vLLM: /health is open and answers 200 while the engine lives, 503 once it is
dead (vllm/entrypoints/serve/instrumentator/health.py:22-33); an unknown `model` gets 404
"The model `X` does not exist.".

Auth, legacy mode: with an API key every /v1 path needs `Authorization: Bearer <key>`, else 401
{"error": "Unauthorized"}.
Auth, V2 mode (vLLM 0.33.0, vllm/entrypoints/serve/middleware/authenticate.py:11-62): paths
under GUARDED_PREFIX = /v1, /v2, /inference, /cohere (after root_path) need `<scheme> <key>`
with scheme "bearer" in any case and one of the keys; OPTIONS is never checked; everything
else is open, including /invocations, which serves chat and completions without a key
(vllm/entrypoints/serve/sagemaker/api_router.py:91-140, registered by
vllm/entrypoints/launchers/api_server/routers.py:40-44), and /ping (= /health).
`/sim/ranks` is the simulator's own route (not vLLM's), outside GUARDED_PREFIX: what each
rank's environment ended up with (secrets as presence only).
"""

import asyncio
import hashlib
import hmac
import json
import os
import secrets
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from vllm_sim import simulated_version
from vllm_sim.engine_core import EngineCore
from vllm_sim.logger import init_logger
from vllm_sim.streaming import ENGINE_ERROR, stream

logger = init_logger(__name__)


# `--max-num-seqs` unset: vLLM's default for the OpenAI server, 256 (vllm/engine/arg_utils.py
# EngineArgs.get_batch_defaults, UsageContext.OPENAI_API_SERVER; vLLM raises it to 1024 on a
# GPU of >= 70 GiB that is not an A100, which the simulator has none of).
DEFAULT_MAX_NUM_SEQS = 256


@dataclass
class ServerState:
    served_model_name: str
    model: str
    tensor_parallel_size: int
    pipeline_parallel_size: int
    rank_ips: list[str]  # Ray node address of each rank, in rank order
    max_model_len: int | None = None
    api_key: str | None = None
    api_keys: list[str] = field(default_factory=list)
    v2: bool = False
    # V2: per rank {"rank", "node_ip", "node_id", "driver_node", "pid", "env"} (ray_env.py)
    rank_reports: list[dict[str, Any]] | None = None
    # Called off the event loop; True while the engine's ranks answer.
    check_health: Callable[[], bool] = lambda: True
    # Called off the event loop: one engine step on every rank (blocks while one is frozen).
    step: Callable[[], None] = lambda: None
    # --reasoning-parser: vLLM 0.26.0 returns content null and the text in `reasoning` while
    # the model has not closed its reasoning (tests/fixtures/real-vllm, scenario reasoning)
    reasoning_parser: str | None = None
    # --max-num-seqs: at most this many requests run in a step, the rest wait (FIFO)
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    # the gauges as the last finished engine step published them: a frozen step leaves them
    # stale (vLLM 0.26.0 read num_requests_running 0 while a request hung)
    published_running: int = 0
    published_waiting: int = 0
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


# vllm/entrypoints/serve/middleware/authenticate.py:11
GUARDED_PREFIX = ("/v1", "/v2", "/inference", "/cohere")


def _v2_token_ok(header: str | None, keys: list[str]) -> bool:
    """authenticate.py:30-45: `<scheme> <token>`, scheme 'bearer' in any case, any key."""
    if not header:
        return False
    scheme, _, param = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    given = hashlib.sha256(param.encode()).digest()
    ok = False
    for key in keys:
        ok |= secrets.compare_digest(given, hashlib.sha256(key.encode()).digest())
    return ok


def build_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="vllm-sim", version=simulated_version())
    engine = EngineCore(state)

    # Added first, so it runs last, after the authentication below and any --middleware.
    @app.middleware("http")
    async def websocket_handshake(request: Request, call_next):  # type: ignore[no-untyped-def]
        # A websocket handshake that passed the auth: vllm-sim serves no websocket route, and
        # a handshake no route accepts is refused 403 (Starlette closes it before accepting,
        # uvicorn answers the handshake 403), as vLLM 0.26.0 refused WS /v1/realtime with the
        # key (tests/fixtures/real-vllm). vllm-sim's uvicorn has no websocket library, so the
        # handshake arrives here as a plain request with its Upgrade header.
        if request.headers.get("upgrade", "").lower() == "websocket":
            return Response(status_code=403)
        return await call_next(request)

    @app.middleware("http")
    async def authentication(request: Request, call_next):  # type: ignore[no-untyped-def]
        if state.v2:
            root = request.scope.get("root_path", "")
            path = request.scope["path"].removeprefix(root)
            if (
                state.api_keys
                and request.method != "OPTIONS"
                and path.startswith(GUARDED_PREFIX)
                and not _v2_token_ok(request.headers.get("Authorization"), state.api_keys)
            ):
                return JSONResponse({"error": "Unauthorized"}, status_code=401)
            return await call_next(request)
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
        return {"version": simulated_version()}

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
        env = ""
        if state.rank_reports:
            env = " " + "; ".join(_rank_env_summary(r) for r in state.rank_reports)
        return (
            "vllm-sim (simulator, no inference): "
            f"TP={state.tensor_parallel_size} PP={state.pipeline_parallel_size} "
            f"ranks on {', '.join(state.rank_ips)}{env} \u2014 you said: {said}"
        )

    async def _read_json(request: Request) -> dict[str, Any] | JSONResponse:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error("Request body is not valid JSON.", "BadRequestError", 400)
        if not isinstance(body, dict):
            return _error("Request body must be a JSON object.", "BadRequestError", 400)
        return body

    # The first generation after the start waits for kernels compiled on first use (Triton,
    # FlashInfer JIT, shapes torch.compile did not see): VLLM_SIM_FIRST_REQUEST_S, simulator-
    # only, default 0. Only the first; it holds every request that arrives meanwhile.
    first_wait = {"s": float(os.environ.get("VLLM_SIM_FIRST_REQUEST_S") or 0)}
    first_lock = asyncio.Lock()

    async def _first_generation() -> None:
        async with first_lock:
            seconds, first_wait["s"] = first_wait["s"], 0.0
            if seconds > 0:
                logger.info("First request: compiling kernels on first use (simulated, %.1f s)",
                            seconds)
                await asyncio.sleep(seconds)

    async def _complete(body: dict[str, Any], said: str, prompt_text: str, chat: bool) -> Response:
        if (bad := _check_model(body)) is not None:
            return bad
        if not await engine_alive():
            return _engine_error()
        await _first_generation()
        text = _answer(said)
        prompt_tokens = _count_tokens(prompt_text)
        limit = body.get("max_tokens")
        if limit is None:
            limit = body.get("max_completion_tokens")
        if limit is not None:
            try:
                limit = int(limit)
            except (TypeError, ValueError):
                return _error(f"max_tokens must be an integer, got {limit!r}.",
                              "BadRequestError", 400, "max_tokens")
            if limit < 1:  # vllm/sampling_params.py SamplingParams._verify_args
                return _error(f"max_tokens must be at least 1, got {limit}.",
                              "BadRequestError", 400, "max_tokens")
        # ignore_eos (vLLM's extension): exactly max_tokens; else the canned text's length,
        # cut at max_tokens (the text itself stays whole: it is canned)
        completion_tokens = ((limit or 16) if body.get("ignore_eos")
                             else min(_count_tokens(text), limit or 1 << 30))
        # "length" when max_tokens ended it (always with ignore_eos), as vLLM says
        finish = "length" if limit is not None and completion_tokens >= limit else "stop"
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        model = state.served_model_name
        created = int(time.time())
        message: dict[str, Any] = {"role": "assistant", "content": text}
        kwargs = body.get("chat_template_kwargs") or {}
        if chat and state.reasoning_parser and kwargs.get("enable_thinking") is not False:
            # the model never closed its reasoning: all of it is reasoning; a named tool
            # choice then leaves content "" (nothing after the reasoning to constrain)
            named = isinstance(body.get("tool_choice"), dict)
            message = {"role": "assistant", "content": "" if named else None,
                       "reasoning": text}
        elif chat and state.reasoning_parser:
            message["reasoning"] = None
        if chat:
            rid, obj = f"chatcmpl-{uuid.uuid4().hex}", "chat.completion"
            choice: dict[str, Any] = {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": finish,
            }
        else:
            rid, obj = f"cmpl-{uuid.uuid4().hex}", "text_completion"
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        if body.get("stream"):
            # The request enters the engine when the stream starts (as vLLM's generate() is
            # first iterated by the stream generator); the 200 and the headers go out at once,
            # the first chunk when the first engine step produced a token.
            return StreamingResponse(
                stream(engine, completion_tokens, prompt_tokens,
                        rid, created, model, text, usage, chat,
                        "reasoning" if message.get("reasoning") else "content",
                        token_ids=bool(body.get("return_token_ids")), finish=finish,
                        include_usage=bool((body.get("stream_options") or {})
                                           .get("include_usage"))),
                media_type="text/event-stream"
            )
        state.running += 1
        req = engine.submit(completion_tokens)
        try:
            await engine.finished(req)
            state.success_total += 1
            state.prompt_tokens_total += prompt_tokens
        except RuntimeError:
            return _engine_error()
        finally:
            state.running -= 1
            if not req.done.done():  # cancelled: the client went away
                engine.abort(req)
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
        return await chat_completions_body(body)

    async def chat_completions_body(body: dict[str, Any]) -> Response:
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
        return await completions_body(body)

    async def completions_body(body: dict[str, Any]) -> Response:
        prompt = body.get("prompt", "")
        if isinstance(prompt, list):
            prompt = " ".join(str(p) for p in prompt)
        return await _complete(body, str(prompt), str(prompt), chat=False)

    if state.v2:

        @app.api_route("/ping", methods=["GET", "POST"])
        async def ping() -> Response:
            # sagemaker/api_router.py:91-96: the health check under another name.
            return Response(status_code=200 if await engine_alive() else 503)

        @app.post("/invocations")
        async def invocations(request: Request) -> Response:
            # sagemaker/api_router.py:98-140: the body is tried as a chat request, then as a
            # completion request (generate/factories.py:37-40); no API key is asked for. The
            # body's `model` is not checked: vLLM 0.26.0 answered 200 to a completion naming a
            # model it does not serve, which /v1/completions refused 404
            # (tests/fixtures/real-vllm, routes; the SageMaker decorators on the route were not
            # read): the served model answers.
            body = await _read_json(request)
            if isinstance(body, JSONResponse):
                return body
            body = {**body, "model": None}
            if isinstance(body.get("messages"), list) and body["messages"]:
                return await chat_completions_body(body)
            if "prompt" in body:
                return await completions_body(body)
            return _error(
                "Cannot find suitable handler for request. Expected one of: "
                "['ChatCompletionRequest', 'CompletionRequest']",
                "BadRequestError",
                400,
            )

        @app.get("/load")
        async def load() -> dict[str, int]:
            return {"server_load": state.running}

        @app.get("/sim/ranks")
        async def sim_ranks() -> dict[str, Any]:
            return {"simulator": True, "ranks": state.rank_reports or []}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        labels = f'engine="0",model_name="{state.served_model_name}"'
        lines = [
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{{{labels}}} {float(state.published_running)}",
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{{{labels}}} {float(state.published_waiting)}",
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
            f'vllm_sim_info{{version="{simulated_version()}",'
            f'tensor_parallel_size="{state.tensor_parallel_size}",'
            f'pipeline_parallel_size="{state.pipeline_parallel_size}"}} 1.0',
        ]
        return PlainTextResponse(
            "\n".join(lines) + "\n", media_type="text/plain; version=0.0.4; charset=utf-8"
        )

    return app


def _rank_env_summary(report: dict[str, Any]) -> str:
    """`r0@127.0.0.2[NCCL_SOCKET_IFNAME=eth0(node) HF_TOKEN=set(driver)]`: values of the fabric
    keys with where they came from; secrets as set/unset only."""
    parts = []
    for key, entry in report["env"].items():
        if "value" in entry:
            parts.append(f"{key}={entry['value']}({entry['source']})")
        elif entry.get("present"):
            parts.append(f"{key}=set({entry['source']})")
        else:
            parts.append(f"{key}=unset")
    return f"r{report['rank']}@{report['node_ip']}[{' '.join(parts)}]"


def _engine_error() -> JSONResponse:
    return _error(ENGINE_ERROR, "InternalServerError", 500)
