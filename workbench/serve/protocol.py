"""What an OpenAI-compatible request asks for, checked field by field before anything is taken.

`parse(body, chat, engine)` reads the JSON body of ``POST /v1/completions`` or
``/v1/chat/completions`` into a `Parsed` request. Every problem is an `ApiError` (HTTP 400,
OpenAI's error body) naming the field, the value and what is allowed. Fields that ask for what
this engine does not do (`best_of` > 1, `suffix`, tools, `store`: `_HARMLESS`) are refused, and
unknown ones too, as OpenAI's API does; docs/serving.md ("The API") lists what is honoured.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..core import SamplingParams
from ..core.sampling import MAX_LOGPROBS


def _none_or(*allowed):
    """A check that a field is missing or one of `allowed`, types compared (`True` is not 1)."""
    return lambda v: v is None or any(type(v) is type(a) and v == a for a in allowed)


# fields this engine cannot honour, the values that ask for nothing (the OpenAI defaults), and
# what the server does instead
_NO_TOOLS = "it calls no tools"
_HARMLESS = {
    "best_of": (_none_or(1), "one sample a choice"),
    "suffix": (_none_or(""), "no text after the insertion"),
    "tools": (_none_or([]), _NO_TOOLS),
    "tool_choice": (_none_or("none"), _NO_TOOLS),
    "functions": (_none_or([]), _NO_TOOLS),
    "function_call": (_none_or("none"), _NO_TOOLS),
    "min_tokens": (_none_or(0), "no minimum length"),
    "parallel_tool_calls": (_none_or(True, False), _NO_TOOLS),
}
# chat fields of OpenAI's API likewise
_CHAT_HARMLESS = {
    "store": (_none_or(False), "it stores nothing"),
    "service_tier": (_none_or("auto", "default"), "one tier"),
    "modalities": (_none_or(["text"]), "text only"),
    "reasoning_effort": (_none_or(), "no reasoning settings"),
}
_PENALTIES = {"presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0}
_COMMON = {
    "model",
    "n",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "ignore_eos",
    "stream",
    "stream_options",
    "return_token_ids",
    "logit_bias",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "user",
    "metadata",
    *_HARMLESS,
}
FIELDS = {
    False: _COMMON | {"prompt", "logprobs", "echo"},
    True: _COMMON
    | {"messages", "max_completion_tokens", "response_format", "logprobs", "top_logprobs"}
    | set(_CHAT_HARMLESS),
}
COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
MAX_CHOICES = 128  # `n`: OpenAI's bound


class ApiError(Exception):
    """A request refused: its HTTP status, OpenAI's error body (`body()`), the field named."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message, self.param, self.status = message, param, status

    def body(self) -> dict:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        code = {
            400: "bad_request",
            404: "not_found",
            405: "method_not_allowed",
            413: "request_too_large",
            503: "overloaded",
        }.get(self.status)
        return {
            "error": {
                "message": self.message,
                "type": kind,
                "param": self.param,
                "code": code or str(self.status),
            }
        }


@dataclass
class Parsed:
    """One checked request."""

    chat: bool
    token_ids: list[int]  # the prompt (of several, completions' first)
    sampling: SamplingParams
    stream: bool = False
    include_usage: bool = False
    stop: tuple[str, ...] = ()
    return_token_ids: bool = False
    model: str = ""
    n: int = 1  # choices a prompt: one request each in the engine
    echo: str | None = None  # completions' echo: the prompt's text, which the answer begins with
    # completions' max_tokens 0 with echo: the prompt scored and nothing generated (the engine
    # samples one token, which the answer leaves out)
    echo_only: bool = False
    # completions' further prompts (a list of them), each with its echo as above
    more: tuple[tuple[list[int], str | None], ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def prompts(self) -> list[tuple[list[int], str | None]]:
        """Every prompt and its echo, in the order of the choices (`n` each)."""
        return [(self.token_ids, self.echo), *self.more]


def parse(body: Any, chat: bool, engine) -> Parsed:
    """A request's JSON body checked against `engine` (the `serve.Service`: its tokenizer,
    served names, context and KV pool)."""
    if not isinstance(body, dict):
        raise ApiError(f"the request body must be a JSON object, got {type(body).__name__}")
    unknown = sorted(set(body) - FIELDS[chat])
    if unknown:
        allowed = ", ".join(sorted(FIELDS[chat]))
        raise ApiError(
            f"unrecognized request argument {unknown[0]!r} (this endpoint takes: {allowed})",
            unknown[0],
        )
    for name, (asks_nothing, instead) in (_HARMLESS | (_CHAT_HARMLESS if chat else {})).items():
        if name in body and not asks_nothing(body[name]):
            raise ApiError(
                f"{name}={body[name]!r} is not supported by this server ({instead}); "
                f"leave {name} out",
                name,
            )
    if chat and body.get("response_format") not in (None, {"type": "text"}):
        raise ApiError(
            f"response_format={body['response_format']!r} is not supported (only "
            "{'type': 'text'})",
            "response_format",
        )
    _unused_fields(body)
    model = _model(body, engine)
    prompts = [_chat_ids(body, engine)] if chat else _prompt_ids(body, engine)
    ids = prompts[0]
    echo = not chat and _flag(body, "echo")
    echo_only = echo and _is_zero(body.get("max_tokens"))
    sampling = _sampling(body, chat, ids, engine, echo, echo_only)
    for i, prompt in enumerate(prompts):
        try:
            engine.check_request(prompt, sampling)
        except (TypeError, ValueError) as exc:
            message = str(exc)
            sent_max = "max_tokens" in body or "max_completion_tokens" in body
            if "max_tokens" in message and engine.room_for(prompt) < 1:  # the prompt alone
                field_name = "messages" if chat else "prompt"
                room = min(engine.limits.max_seq_len, engine.limits.kv_capacity)
                what = f"prompt[{i}] has" if len(prompts) > 1 else "the prompt has"
                what = "the messages come to" if chat else what
                message = (
                    f"{what} {len(prompt)} tokens, leaving no room for an answer in the "
                    f"context of {room} tokens"
                )
            elif "max_tokens" in message and sent_max:
                field_name = "max_tokens"
            elif message.startswith("logit_bias"):
                field_name = "logit_bias"
            elif message.startswith("presence_penalty"):  # (a server of several ranks)
                asked = [f for f in _PENALTIES if body.get(f) not in (None, _PENALTIES[f])]
                field_name = asked[0] if asked else "presence_penalty"
            else:
                field_name = "messages" if chat else "prompt"
            if len(prompts) > 1 and f"prompt[{i}]" not in message:
                # (the engine's check numbers its prompt 0: here it is this list's i)
                named = message.replace("prompt 0", f"prompt[{i}]")
                message = named if named != message else f"prompt[{i}]: {message}"
            raise ApiError(message, field_name) from None
    n = _choices(body, engine, len(prompts))
    stream = _flag(body, "stream")
    options = body.get("stream_options")
    if options is not None and (not isinstance(options, dict) or set(options) - {"include_usage"}):
        raise ApiError(
            f"stream_options={options!r}: only {{'include_usage': true | false}} is supported",
            "stream_options",
        )
    if options is not None and not stream:
        raise ApiError("stream_options is only allowed with stream=true", "stream_options")
    include_usage = bool(options and _flag(options, "include_usage", "stream_options."))
    return Parsed(
        chat=chat,
        token_ids=ids,
        sampling=sampling,
        stream=stream,
        include_usage=include_usage,
        stop=_stop(body),
        return_token_ids=_flag(body, "return_token_ids"),
        model=model,
        n=n,
        echo=_prompt_text(body, engine, ids, 0) if echo else None,
        echo_only=echo_only,
        more=tuple(
            (prompt, _prompt_text(body, engine, prompt, i) if echo else None)
            for i, prompt in enumerate(prompts[1:], 1)
        ),
    )


def _unused_fields(body: dict) -> None:
    """`user` and `metadata` are accepted and unused, but of OpenAI's types."""
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise ApiError(f"user must be a string, got {user!r:.80}", "user")
    metadata = body.get("metadata")
    if metadata is not None and not (
        isinstance(metadata, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
    ):
        raise ApiError(
            f"metadata must be an object of string keys and string values, got {metadata!r:.80}",
            "metadata",
        )


def _model(body: dict, engine) -> str:
    model = body.get("model", engine.served_name)
    if not isinstance(model, str):
        raise ApiError(f"model must be a string, got {model!r}", "model")
    if model not in engine.model_names:
        names = ", ".join(repr(n) for n in engine.model_names)
        raise ApiError(f"model {model!r} is not served here (served: {names})", "model")
    return model


def _prompts(body: dict) -> list:
    """The prompts as sent: one (a string or a list of token ids), or a list of them."""
    prompt = body["prompt"]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str | list) for p in prompt):
        return prompt
    return [prompt]


def _prompt_ids(body: dict, engine) -> list[list[int]]:
    """Each prompt's token ids: a prompt is a string or a list of token ids, and completions
    take a list of prompts too (their choices in that order)."""
    if "prompt" not in body:
        raise ApiError("prompt is required: a string or a list of token ids", "prompt")
    prompts = _prompts(body)
    out = []
    for i, prompt in enumerate(prompts):
        where = "prompt" if len(prompts) == 1 else f"prompt[{i}]"
        if (
            not isinstance(prompt, str | list)
            or isinstance(prompt, list)
            and not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
        ):
            raise ApiError(
                f"{where} must be a string or a list of token ids (integers), got {prompt!r:.80}",
                "prompt",
            )
        try:
            if isinstance(prompt, str):
                engine.check_text_length(len(prompt), where)
            out.append(engine.encode(prompt))
        except (TypeError, ValueError) as exc:
            raise ApiError(str(exc).replace("prompt 0", where), "prompt") from None
    return out


def _chat_ids(body: dict, engine) -> list[int]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(
            f"messages must be a non-empty list of {{'role', 'content'}} objects, got "
            f"{messages!r:.80}",
            "messages",
        )
    turns = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or "role" not in message:
            raise ApiError(f"{where} must be an object with a role and content", where)
        role, content = message["role"], message.get("content")
        if role not in ("system", "developer", "user", "assistant"):
            raise ApiError(
                f"{where}.role={role!r}: allowed are 'system', 'developer', 'user', 'assistant'",
                f"{where}.role",
            )
        turns.append(
            {"role": "system" if role == "developer" else role, "content": _text(content, where)}
        )
    try:
        engine.check_text_length(sum(len(t["content"]) for t in turns), "messages' content")
    except ValueError as exc:
        raise ApiError(str(exc), "messages") from None
    try:
        encoded = engine.tokenizer.apply_chat_template(turns, add_generation_prompt=True)
    except Exception as exc:  # the model's own template refused it (e.g. roles out of turn)
        raise ApiError(
            f"the model's chat template refused the messages: {exc}", "messages"
        ) from None
    ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded
    return [int(t) for t in ids]


def _text(content: Any, where: str) -> str:
    """A message's content: a string, or a list of text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in content
    ):
        return "".join(p["text"] for p in content)
    raise ApiError(
        f"{where}.content must be a string or a list of {{'type': 'text', 'text': ...}} parts "
        f"(this model reads text only), got {content!r:.80}",
        f"{where}.content",
    )


def _prompt_text(body: dict, engine, ids: list[int], index: int) -> str:
    """The prompt `index` as echoed: its text as sent, or its token ids' text."""
    prompt = _prompts(body)[index]
    if isinstance(prompt, str):
        return prompt
    known = len(engine.tokenizer)
    return engine.tokenizer.decode([t for t in ids if t < known], skip_special_tokens=True)


def _is_zero(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value == 0


def _sampling(
    body: dict, chat: bool, ids: list[int], engine, echo: bool = False, echo_only: bool = False
) -> SamplingParams:
    max_tokens = 1 if echo_only else body.get("max_tokens")
    name = "max_tokens"
    if chat and body.get("max_completion_tokens") is not None:
        if max_tokens is not None:
            raise ApiError("give max_tokens or max_completion_tokens, not both", "max_tokens")
        max_tokens, name = body["max_completion_tokens"], "max_completion_tokens"
    if max_tokens is None:  # OpenAI's defaults: 16 for completions, as long as fits for chat
        max_tokens = COMPLETION_MAX_TOKENS if not chat else max(1, engine.room_for(ids))
    logprobs = _logprobs(body, chat)
    options = {
        "logprobs": logprobs,
        # echoed with log probabilities: the prompt's too
        "prompt_logprobs": logprobs if echo else None,
        "max_tokens": max_tokens,
        "temperature": body.get("temperature", 1.0),
        "top_p": body.get("top_p", 1.0),
        "top_k": body.get("top_k", -1),
        "seed": body.get("seed"),
        "ignore_eos": body.get("ignore_eos", False),
        "logit_bias": _logit_bias(body.get("logit_bias")),
        **{name: body.get(name, default) for name, default in _PENALTIES.items()},
    }
    defaults = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, **_PENALTIES}
    for key, value in options.items():  # None is the default, as OpenAI's clients send it
        if value is None and key not in ("seed", "logprobs", "prompt_logprobs", "logit_bias"):
            options[key] = defaults.get(key, False)
    try:
        return SamplingParams(**options)
    except (TypeError, ValueError) as exc:
        message = str(exc)
        param = next((k for k in options if message.startswith(k)), None) or next(
            (k for k in options if k in message), None
        )
        if param == "max_tokens":
            param, message = name, message.replace("max_tokens", name, 1)
            if not chat and _is_zero(max_tokens):
                message += " (0 only with echo: the prompt scored, nothing generated)"
        raise ApiError(message, param) from None


def _logit_bias(value: Any) -> Any:
    """OpenAI's `logit_bias` (token ids as the JSON object's keys, strings) with integer keys;
    its values are checked by `SamplingParams`."""
    if not isinstance(value, dict):
        return value  # (None, or what SamplingParams refuses)
    bias = {}
    for key, bias_value in value.items():
        try:
            token = int(key) if isinstance(key, str) and key.isascii() else None
        except ValueError:
            token = None
        if token is None:
            raise ApiError(
                f"logit_bias's keys must be token ids (integers as strings), got {key!r:.40}",
                "logit_bias",
            )
        bias[token] = bias_value
    return bias


def _choices(body: dict, engine, prompts: int = 1) -> int:
    """`n`: how many choices a prompt, each its own request in the engine, so at most as many in
    all as the server queues."""
    n = body.get("n", 1)
    n = 1 if n is None else n
    queued = engine.limits.max_queued
    most = min(MAX_CHOICES, queued)
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= most:
        why = "" if most == MAX_CHOICES else f" (--max-queued-requests {most})"
        raise ApiError(f"n must be an integer in [1, {most}]{why}, got {n!r:.40}", "n")
    if n * prompts > queued:
        raise ApiError(
            f"{prompts} prompts of n={n} choices are {n * prompts} requests, more than this "
            f"server queues (--max-queued-requests {queued})",
            "n" if n > 1 else "prompt",
        )
    return n


def _logprobs(body: dict, chat: bool) -> int | None:
    """The most likely tokens each output token reports beside its own log probability (None:
    no log probabilities): completions' `logprobs` (an integer), chat's `top_logprobs` under
    `logprobs: true`."""
    if not chat:
        value = body.get("logprobs")  # (checked by SamplingParams: an integer or None)
        return None if value is False else value  # (false: none, as clients may send it)
    top = body.get("top_logprobs")
    if not _flag(body, "logprobs"):
        if top not in (None, 0) or isinstance(top, bool):
            raise ApiError(f"top_logprobs={top!r} needs logprobs=true", "top_logprobs")
        return None
    if top is None:
        return 0
    if not isinstance(top, int) or isinstance(top, bool) or not 0 <= top <= MAX_LOGPROBS:
        raise ApiError(
            f"top_logprobs must be an integer in [0, {MAX_LOGPROBS}], got {top!r:.40}",
            "top_logprobs",
        )
    return top


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise ApiError(
            f"stop must be a non-empty string or a list of them, got {stop!r:.80}", "stop"
        )
    return tuple(stops)


def _flag(body: dict, name: str, prefix: str = "") -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ApiError(f"{prefix}{name} must be true or false, got {value!r}", prefix + name)
    return value
