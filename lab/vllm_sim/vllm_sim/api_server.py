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
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from vllm_sim import simulated_version
from vllm_sim.logger import init_logger

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


# The engine loop: one step generates this many tokens for every running request and takes
# at least STEP_S: at most 400 tokens/s a request, real vLLM 0.26.0's pace with the tiny
# model on an H200 (tests/fixtures/real-vllm: 380-510 tokens/s a request, 16 or 64 running;
# 16 requests of 1500 tokens still in flight 3 s after they were sent, and a long queue
# holding a canary for more than 10 s behind 4 batches of them, seen by the liveness read as
# busy). Was 800 tokens/s: those requests were done before the rank was frozen, and the
# canary came in 7 s (serving).
TOKENS_PER_STEP = 8
STEP_S = 0.02


def step_s() -> float:
    """A step's least duration: STEP_S, or VLLM_SIM_STEP_S (simulator-only): a slower build to
    play, e.g. an image whose serving regressed, for the serving benchmark to name."""
    try:
        return max(0.0, float(os.environ.get("VLLM_SIM_STEP_S") or STEP_S))
    except ValueError:
        return STEP_S


@dataclass(eq=False)
class _Request:
    tokens_left: int
    done: asyncio.Future[None]
    # set when a step produced the request's first token (or the engine failed it)
    first: asyncio.Event = field(default_factory=asyncio.Event)
    # how many tokens each step gave it, in order (a stream sends one chunk per step)
    produced: asyncio.Queue[int] = field(default_factory=asyncio.Queue)


class _Engine:
    """The simulated engine core, vLLM V1's loop in miniature: new requests reach the
    scheduler between steps (the engine core's input queue), which runs at most max_num_seqs
    of them per step and keeps the rest waiting, first come first served (vllm/v1/core/sched/
    scheduler.py: `running`, `waiting`). A step runs on every rank, so one frozen rank stops
    it. The gauges are published when a step ends (SchedulerStats, made after the step's
    outputs), so a step that never ends leaves them at their last value."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.incoming: list[_Request] = []  # arrived since the scheduler last looked
        self.waiting: deque[_Request] = deque()
        self.running: list[_Request] = []
        self.task: asyncio.Task[None] | None = None
        self.step_s = step_s()

    def submit(self, tokens: int) -> _Request:
        loop = asyncio.get_running_loop()
        req = _Request(max(tokens, 1), loop.create_future())
        self.incoming.append(req)
        if self.task is None or self.task.done():
            self.task = loop.create_task(self._loop())
        return req

    def abort(self, req: _Request) -> None:
        """The client went away: the request leaves the engine (vLLM aborts it too)."""
        for queue in (self.incoming, self.waiting, self.running):
            if req in queue:
                queue.remove(req)
        if not req.done.done():
            req.done.cancel()
        req.first.set()

    async def first_token(self, req: _Request) -> None:
        """Returns once a step produced the request's first token; raises if the engine
        failed it first."""
        await req.first.wait()
        if req.done.done() and not req.done.cancelled() and req.done.exception() is not None:
            await req.done  # raises the engine's error

    async def finished(self, req: _Request) -> None:
        await req.done

    async def next_tokens(self, req: _Request) -> int | None:
        """The tokens the request's next step gave it; None once it is done. Raises the
        engine's error when the engine failed it."""
        while True:
            if not req.produced.empty():
                return req.produced.get_nowait()
            if req.done.done():
                await req.done
                return None
            got = asyncio.ensure_future(req.produced.get())
            await asyncio.wait({got, req.done}, return_when=asyncio.FIRST_COMPLETED)
            if got.done():
                return got.result()
            got.cancel()

    def _fail_all(self, err: Exception) -> None:
        for req in [*self.running, *self.waiting, *self.incoming]:
            if not req.done.done():
                req.done.set_exception(RuntimeError(f"engine step failed: {err}"))
            req.first.set()
        self.running.clear()
        self.waiting.clear()
        self.incoming.clear()

    async def _loop(self) -> None:
        clock = asyncio.get_running_loop()
        while self.incoming or self.waiting or self.running:
            started = clock.time()
            self.waiting.extend(self.incoming)
            self.incoming.clear()
            while self.waiting and len(self.running) < self.state.max_num_seqs:
                self.running.append(self.waiting.popleft())
            try:
                await asyncio.to_thread(self.state.step)
            except Exception as err:  # noqa: BLE001 - a dead rank: every request fails
                self._fail_all(err)
                break
            for req in list(self.running):
                n = min(req.tokens_left, TOKENS_PER_STEP)
                req.tokens_left -= n
                self.state.generation_tokens_total += n
                req.produced.put_nowait(n)
                req.first.set()
                if req.tokens_left <= 0:
                    self.running.remove(req)
                    if not req.done.done():
                        req.done.set_result(None)
            self.state.published_running = len(self.running)
            self.state.published_waiting = len(self.waiting)
            # The pace (a step takes at least STEP_S) is kept after the step's outputs are
            # out, not before: what every rank answered is published at once, so a rank
            # stopped (SIGSTOP) after its step stops the counters at once, as on vLLM 0.26.0
            # (tests/fixtures/real-vllm: no token after the stop). Was: the step and STEP_S's
            # sleep together, so a step answered just before the stop came out after it.
            await asyncio.sleep(max(0.0, self.step_s - (clock.time() - started)))


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
    engine = _Engine(state)

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
                "finish_reason": "stop",
            }
        else:
            rid, obj = f"cmpl-{uuid.uuid4().hex}", "text_completion"
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "stop"}
        if body.get("stream"):
            # The request enters the engine when the stream starts (as vLLM's generate() is
            # first iterated by the stream generator); the 200 and the headers go out at once,
            # the first chunk when the first engine step produced a token.
            return StreamingResponse(
                _stream(engine, completion_tokens, prompt_tokens,
                        rid, created, model, text, usage, chat,
                        "reasoning" if message.get("reasoning") else "content",
                        token_ids=bool(body.get("return_token_ids"))),
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


ENGINE_ERROR = "EngineCore encountered an issue. See stack trace (above) for the root cause."


def _engine_error() -> JSONResponse:
    return _error(ENGINE_ERROR, "InternalServerError", 500)


def _pieces(text: str, tokens: int) -> list[str]:
    """The canned text as its tokens' texts, each word with the space after it; when the
    request asks for more tokens than the text has words (ignore_eos), the words again, so
    that every token has a text as a real model's has."""
    words = text.split(" ")
    n = max(tokens, len(words))
    return [words[i % len(words)] + ("" if i == n - 1 else " ") for i in range(n)]


async def _stream(engine: _Engine, completion_tokens: int, prompt_tokens: int,
                  rid: str, created: int, model: str, text: str, usage: dict[str, int],
                  chat: bool, field_name: str = "content",
                  token_ids: bool = False) -> AsyncIterator[str]:
    """Server-sent events as vLLM's stream generator sends them: the role's chunk, then one
    chunk per engine step that gave the request tokens (that step's text, and with
    `return_token_ids` its token ids: vllm/entrypoints/openai/chat_completion/serving.py,
    0.26.0), then the finish chunk with the usage. The canned text is cut into the tokens'
    texts (repeated past its end: _pieces), and a request cut short by max_tokens gets the
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

    pieces = _pieces(text, completion_tokens)
    sent = 0  # tokens sent
    state.running += 1
    req = engine.submit(completion_tokens)
    try:
        try:
            await engine.first_token(req)
        except RuntimeError:
            yield _error_event()
            return
        if chat:
            yield chunk(
                {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
            )
        while True:
            try:
                n = await engine.next_tokens(req)
            except RuntimeError:
                yield _error_event()
                return
            if n is None:
                break
            last = sent + n >= completion_tokens
            piece = "".join(pieces[sent:] if last else pieces[sent:sent + n])
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


def _error_event() -> str:
    body = {"error": {"message": ENGINE_ERROR, "type": "InternalServerError", "param": None,
                      "code": 500}}
    return f"data: {json.dumps(body)}\n\ndata: [DONE]\n\n"
