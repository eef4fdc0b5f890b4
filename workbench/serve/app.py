"""The HTTP side: FastAPI routes in the shape vLLM and SGLang serve them. A bad request is a 400
naming the field, a body over `MAX_BODY_BYTES` a 413, a full queue a 503 with `Retry-After`; a
client that leaves aborts its request at once."""

# NOTE: no `from __future__ import annotations`: FastAPI reads the routes' annotations (the
# Request of a route defined in create_app) when it builds them
import asyncio
import json
from typing import TYPE_CHECKING

from .output import Delta, Output
from .protocol import ApiError, parse

if TYPE_CHECKING:
    from .service import Service

ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics")
MAX_BODY_BYTES = 16 * 2**20  # a prompt of the longest context is far less (as text or ids)
_POLL_S = 0.25  # how often a whole (not streamed) answer checks that its client is still there


def create_app(service: "Service", lifespan=None):
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response, StreamingResponse
    from starlette.exceptions import HTTPException

    app = FastAPI(title="workbench", docs_url=None, redoc_url=None, lifespan=lifespan)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):
        """404, 405 and the like in OpenAI's error shape, as every other refusal here."""
        message = f"{request.method} {request.url.path}: {exc.detail}"
        if exc.status_code == 404:
            message += f" (served: {', '.join(ROUTES)})"
        error = ApiError(message, status=exc.status_code)
        return JSONResponse(error.body(), status_code=exc.status_code, headers=exc.headers)

    def error(exc: ApiError) -> JSONResponse:
        service.metrics.rejected.labels(str(exc.status)).inc()
        headers = {"Retry-After": "1"} if exc.status == 503 else None
        return JSONResponse(exc.body(), status_code=exc.status, headers=headers)

    async def handle(request: Request, chat: bool):
        try:
            body = await _read_json(request)
            loop = asyncio.get_running_loop()
            parsed = await loop.run_in_executor(service.parser, parse, body, chat, service)
            outputs = service.accept(parsed)
        except ApiError as exc:
            return error(exc)
        if parsed.stream:
            events = _counted(service, _stream(service, outputs))
            return StreamingResponse(events, media_type="text/event-stream")
        service.responses += 1
        try:
            whole = await _whole(service, outputs, request)
        finally:
            service.responses -= 1
        if whole is None:  # the client left
            return Response(status_code=499)
        failed = next((o for o in outputs if o.finish_reason == "error"), None)
        if failed is not None:  # its step failed: the engine serves the others
            return error(ApiError(f"the request failed in the engine: {failed.error}", status=500))
        return JSONResponse(whole)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await handle(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await handle(request, chat=True)

    @app.get("/v1/models")
    async def models():
        return {
            "object": "list",
            "data": [service.model_card(name) for name in service.model_names],
        }

    @app.get("/health")
    async def health():
        if not service.serving:
            return JSONResponse({"status": "stopped"}, status_code=503)
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        text, kind = service.metrics.text()
        return Response(text, media_type=kind)

    return app


async def _read_json(request) -> object:
    """The body as JSON; a 413 beyond `MAX_BODY_BYTES` (read no further), a 400 if not JSON."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > MAX_BODY_BYTES:
        raise ApiError(
            f"the request body is {int(length):,} bytes, more than the {MAX_BODY_BYTES:,} allowed",
            status=413,
        )
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise ApiError(
                f"the request body is more than the {MAX_BODY_BYTES:,} bytes allowed", status=413
            )
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(f"the request body is not valid JSON: {exc}") from None


async def _counted(service: "Service", events):
    service.responses += 1
    try:
        async for event in events:
            yield event
    finally:
        service.responses -= 1
        await events.aclose()  # its own cleanup now (a client that left: the abort)


async def _stream(service: "Service", outputs: list[Output]):
    """Server-sent events: a chunk per step with text for each choice (its `index`), each
    choice's finish, usage if asked, then [DONE]."""
    parsed = outputs[0].parsed
    finished = 0
    queue: asyncio.Queue = asyncio.Queue()
    pumps = [asyncio.ensure_future(_pump(service, output, queue)) for output in outputs]
    events = [_Events(output) for output in outputs]
    try:
        if parsed.chat:  # the role first, as OpenAI's API sends it
            for output in outputs:
                yield _sse(_chunk(service, output, Delta("", [], None), role=True))
        while finished < len(outputs):
            index, delta = await queue.get()
            output = outputs[index]
            if delta.finish_reason == "error":
                yield _sse(_chunk(service, output, delta))
            elif delta.text or delta.token_ids or delta.finish_reason is not None:
                yield events[index].chunk(delta)
            finished += delta.finish_reason is not None
        if parsed.include_usage:
            yield _sse(_usage_chunk(service, outputs))
        yield "data: [DONE]\n\n"
    finally:
        for pump in pumps:
            pump.cancel()
        if finished < len(outputs):  # cancelled: the client left
            for output in outputs:
                if not output.done:
                    service.cancel(output)


async def _pump(service: "Service", output: Output, queue: asyncio.Queue) -> None:
    """One choice's deltas into a stream's queue, as its tokens come (`stream_interval`), until
    it ends."""
    while True:
        await output.wait()
        delta = output.take()
        if output.stopped:  # a stop string ended it: the engine lets go of it
            service.cancel(output)
        queue.put_nowait((output.index, delta))
        if delta.finish_reason is not None:
            return


async def _whole(service: "Service", outputs: list[Output], request) -> "dict | None":
    """The whole answer once every choice has ended; None if the client left first (its
    requests aborted)."""
    choices = await asyncio.gather(*(_choice(service, o, request) for o in outputs))
    if any(choice is None for choice in choices):
        for output in outputs:
            if not output.done:
                service.cancel(output)
        return None
    return {**_envelope(outputs[0], chunk=False), "choices": choices, "usage": _usage(outputs)}


async def _choice(service: "Service", output: Output, request) -> "dict | None":
    """One choice, whole, once it has ended; None if the client left first."""
    text, ids, logprobs = [], [], []
    prompt_ids, prompt_entries = [], []  # with echo: the prompt's, before the completion's
    while True:
        try:
            await asyncio.wait_for(output.wait(), timeout=_POLL_S)
        except asyncio.TimeoutError:
            if await request.is_disconnected():
                service.cancel(output)
                return None
            continue
        delta = output.take()
        text.append(delta.text)
        ids.extend(delta.token_ids)
        logprobs.extend(delta.logprobs or ())
        if delta.prompt is not None:
            prompt_ids, prompt_entries = delta.prompt[0], delta.prompt[1] or []
        if output.stopped:
            service.cancel(output)
        if delta.finish_reason is not None:
            break
    asked = output.logprobs is not None
    entries = prompt_entries + logprobs if asked else None
    choice = {
        "index": output.index,
        "logprobs": _logprobs(output, prompt_ids + ids, entries, 0),
        "finish_reason": delta.finish_reason,
    }
    if output.parsed.chat:
        choice["message"] = {"role": "assistant", "content": "".join(text)}
    else:
        choice["text"] = "".join(text)
    if output.parsed.return_token_ids:
        choice["token_ids"] = ids
    if output.error:
        choice["error"] = output.error
    return choice


def _usage(outputs: list[Output]) -> dict:
    """The engine's counts, or where a stop string ended a choice's text, its tokens up to the
    one that reached it.
    Each prompt counts once however many choices (`n`) share it, as OpenAI counts it, with its
    first choice's tokens found in the prefix cache."""
    n = outputs[0].parsed.n
    firsts = outputs[::n]
    prompt = sum(len(output.prompt_ids) for output in firsts)
    completion = 0
    for output in outputs:
        if output.answered >= 0:  # a stop string: the tokens up to it
            completion += output.answered
        elif output.usage is not None:
            completion += output.usage["completion_tokens"]
        else:
            completion += len(output.tokens)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": sum(o.cached_tokens for o in firsts)},
    }


def _chunk(service: "Service", output: Output, delta: Delta, role: bool = False) -> dict:
    parsed = output.parsed
    logprobs = _logprobs(output, *_with_prompt(delta))
    if parsed.chat:
        content = {"role": "assistant", "content": ""} if role else {"content": delta.text}
        choice = {"index": output.index, "delta": content, "logprobs": logprobs}
    else:
        choice = {"index": output.index, "text": delta.text, "logprobs": logprobs}
    choice["finish_reason"] = delta.finish_reason
    if parsed.return_token_ids and not role:
        choice["token_ids"] = delta.token_ids
    if delta.finish_reason == "error" and output.error:
        choice["error"] = output.error
    return {**_envelope(output, chunk=True), "choices": [choice]}


def _with_prompt(delta: Delta) -> tuple[list[int], list | None, int]:
    """A delta's tokens, their log probability entries and where their texts start, the echoed
    prompt's first where the delta carries it."""
    if delta.prompt is None or delta.logprobs is None:
        return delta.token_ids, delta.logprobs, delta.offset
    ids, entries = delta.prompt
    return ids + delta.token_ids, (entries or []) + delta.logprobs, 0


def _logprobs(output: Output, ids: list[int], entries: list | None, start: int) -> dict | None:
    """A choice's `logprobs` in OpenAI's form for the tokens `ids` and their `Req.logprobs`
    entries (None: not asked). Chat: a `content` entry per token with its text, log probability,
    own bytes and `top_logprobs`; completions: `tokens`, `token_logprobs`, `top_logprobs` (a
    text -> log probability object per token, the chosen token's among them) and `text_offset`
    (where each token's text starts in the completion's token texts, the first at `start`). An
    entry is None for an echoed prompt's first token, which has none."""
    if entries is None:
        return None
    name = output.token_text
    if output.parsed.chat:

        def item(token: int, logprob: float) -> dict:
            return {"token": name(token), "logprob": logprob, "bytes": list(raw(token))}

        raw = output.token_bytes

        return {
            "content": [
                {**item(token, logprob), "top_logprobs": [item(i, v) for i, v in top]}
                for token, (logprob, top) in zip(ids, entries)
            ]
        }
    texts = [name(token) for token in ids]
    offsets = []
    for text in texts:
        offsets.append(start)
        start += len(text)
    return {
        "tokens": texts,
        "token_logprobs": [None if e is None else e[0] for e in entries],
        # (the chosen token's too, as OpenAI gives it: up to logprobs + 1 a token)
        "top_logprobs": [
            None if e is None else {**{name(i): v for i, v in e[1]}, name(token): e[0]}
            for token, e in zip(ids, entries)
        ],
        "text_offset": offsets,
    }


def _usage_chunk(service: "Service", outputs: list[Output]) -> dict:
    return {**_envelope(outputs[0], chunk=True), "choices": [], "usage": _usage(outputs)}


def _envelope(output: Output, chunk: bool) -> dict:
    """A response's (or a streamed chunk's) fields beside its choices: the same for each."""
    chat = output.parsed.chat
    kind = ("chat.completion.chunk" if chunk else "chat.completion") if chat else "text_completion"
    return {
        "id": output.id,
        "object": kind,
        "created": output.created,
        "model": output.parsed.model,
    }


def _sse(data: dict) -> str:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n"


class _Events:
    """One stream's chunks, as `_chunk` gives them but from a template (a `json.dumps` per chunk
    is costly with many streams)."""

    def __init__(self, output: Output) -> None:
        parsed = output.parsed
        kind = "chat.completion.chunk" if parsed.chat else "text_completion"
        self.head = (
            f'data: {{"id":{json.dumps(output.id)},"object":"{kind}","created":{output.created},'
            f'"model":{json.dumps(parsed.model)},"choices":[{{"index":{output.index},'
            + ('"delta":{"content":' if parsed.chat else '"text":')
        )
        self.close_text = "}," if parsed.chat else ","
        self.ids = parsed.return_token_ids
        self.output = output

    def chunk(self, delta: Delta) -> str:
        finish = "null" if delta.finish_reason is None else json.dumps(delta.finish_reason)
        ids = f',"token_ids":[{",".join(map(str, delta.token_ids))}]' if self.ids else ""
        logprobs = "null"
        if delta.logprobs is not None:
            logprobs = json.dumps(_logprobs(self.output, *_with_prompt(delta)))
        return (
            f"{self.head}{json.dumps(delta.text)}{self.close_text}"
            f'"logprobs":{logprobs},"finish_reason":{finish}{ids}}}]}}\n\n'
        )
