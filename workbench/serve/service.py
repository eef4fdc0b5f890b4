"""The HTTP process's view of the engine: what a request is checked against (`Limits`), the
requests under way (`Output`s by id), and the messages between the two processes."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ..core import SamplingParams, check_request, encode_prompt
from .metrics import Metrics
from .output import Output
from .protocol import ApiError, Parsed

MAX_QUEUED_REQUESTS = 1024  # waiting requests (not yet running) before a 503


@dataclass(frozen=True)
class Limits:
    """What the HTTP process needs of the engine to check a request, and how it is served."""

    model: str
    model_dir: str
    served_name: str
    vocab_size: int
    max_seq_len: int
    page_size: int
    kv_capacity: int  # KV slots of the whole pool
    max_queued: int
    host: str
    port: int
    stream_interval: int = 1  # tokens a streamed chunk waits for (SGLang's --stream-interval)
    tp_size: int = 1


class Service:
    """What the routes and the request checks use (in the HTTP process)."""

    def __init__(self, limits: Limits, tokenizer, send: Callable[[tuple], None]) -> None:
        self.limits = limits
        self.tokenizer = tokenizer
        self.served_name = limits.served_name
        self.model_names = tuple(dict.fromkeys([limits.served_name, limits.model]))
        self.metrics = Metrics()
        self.serving = True
        self.responses = 0  # responses under way (the stop waits for them to end)
        self.outputs: dict[int, Output] = {}
        self.send = send  # to the engine, on the event loop (its transport buffers)
        self._ids = itertools.count()
        self._unseen = 0  # requests sent since the engine last said how many wait
        self._adds: list[tuple] = []  # checked requests not sent yet (sent once a loop turn)
        self.engine_waiting = 0
        # NOTE: requests are parsed (tokenized, the chat template applied) off the event loop,
        # one at a time: a long prompt's tokenizing must not hold up every stream
        self.parser = ThreadPoolExecutor(1, thread_name_prefix="workbench-parse")
        # the most characters one token spans (a byte-level token's characters are its bytes);
        # x4 for what a normalizer may fold together
        longest = max(map(len, tokenizer.get_vocab()), default=1)
        self.max_text_chars = 4 * longest * max(1, min(limits.max_seq_len, limits.kv_capacity))

    # -- what `protocol.parse` asks -----------------------------------------------------------
    def encode(self, prompt) -> list[int]:
        return encode_prompt(self.tokenizer, self.limits.vocab_size, prompt)

    def check_text_length(self, chars: int, what: str) -> None:
        """Refuse a text no context could hold, before tokenizing it."""
        if chars > self.max_text_chars:
            room = min(self.limits.max_seq_len, self.limits.kv_capacity)
            raise ValueError(
                f"{what} has {chars:,} characters: more than {room:,} tokens however the "
                "tokenizer splits them, too long for the context"
            )

    def check_request(self, ids: list[int], sampling: SamplingParams) -> None:
        limits = self.limits
        check_request(
            ids,
            sampling,
            0,
            limits.max_seq_len,
            limits.page_size,
            limits.kv_capacity,
            limits.vocab_size,
            limits.tp_size,
        )

    def room_for(self, ids: list[int]) -> int:
        """The most tokens a request of this prompt may ask for: the context, and the KV pool."""
        return min(self.limits.max_seq_len, self.limits.kv_capacity) - len(ids)

    def accept(self, parsed: Parsed) -> list[Output]:
        """Send a checked request to the engine, as one request per choice (`n` a prompt, the
        prompts in order); a 503 when stopping or when the queue has no room for all of them.
        With a `seed`, a prompt's choice i samples with seed + i: each is reproducible, and a
        prompt's choices differ."""
        if not self.serving:
            raise ApiError("the server is stopping", status=503)
        waiting = self.engine_waiting + self._unseen
        most, n = self.limits.max_queued, parsed.n * len(parsed.prompts)
        if waiting + n > most:
            if n == 1:
                message = f"{waiting} requests are waiting, the most this server queues"
            else:
                message = (
                    f"{waiting} requests are waiting, and this request's {n} choices would "
                    f"make {waiting + n}, more than this server queues"
                )
            raise ApiError(f"{message} (--max-queued-requests {most}); retry later", status=503)
        received = time.perf_counter()
        # NOTE: a whole answer wakes at its end, or with a stop string at each token: the
        # engine lets go of it once its text reaches one, as a stream's does
        interval = self.limits.stream_interval if parsed.stream else 1 if parsed.stop else 1 << 30
        response_id = ("chatcmpl-" if parsed.chat else "cmpl-") + uuid.uuid4().hex[:24]
        # NOTE: one message per turn of the event loop, not one per client
        if not self._adds:
            asyncio.get_running_loop().call_soon(self._send_adds)
        outputs = []
        for index in range(n):
            prompt, echo = parsed.prompts[index // parsed.n]
            choice = index % parsed.n
            output = Output(
                parsed, received, self.tokenizer, self.limits.vocab_size, interval, prompt, echo
            )
            output.id, output.index = response_id, index
            rid = output.rid = next(self._ids)
            self.outputs[rid] = output
            sampling = parsed.sampling
            if choice and sampling.seed is not None:
                sampling = dataclasses.replace(sampling, seed=(sampling.seed + choice) % 2**63)
            self._adds.append((rid, prompt, sampling, received))
            outputs.append(output)
        self._unseen += n
        return outputs

    def _send_adds(self) -> None:
        adds, self._adds = self._adds, []
        if adds:
            self.send(("adds", adds))

    def cancel(self, output: Output) -> None:
        """Abort a request in the engine (its client left, or a stop string ended it)."""
        if not output.cancelled:
            output.cancelled = True
            self._send_adds()  # (after its own add, if that is still waiting to go)
            self.send(("abort", output.rid))

    # -- from the engine: one message a step (on the event loop) -----------------------------
    def deliver(self, message: tuple) -> None:
        _, tokens, ends, cached, state, refused, step_s, sent, logprobs, prompt_logprobs = message
        logprobs = dict(logprobs)
        for rid, entries in prompt_logprobs:  # (with the first token, so before it)
            output = self.outputs.get(rid)
            if output is not None:
                output.prompt_logprobs = entries
        now, metrics = time.perf_counter(), self.metrics
        # NOTE: perf_counter is the machine's monotonic clock, the same in both processes
        metrics.delivery.observe(max(now - sent, 0.0))
        for rid, count in cached:  # (its first admission's: a later chunk's counts its own)
            output = self.outputs.get(rid)
            if output is not None and not output.admitted:
                output.cached_tokens, output.admitted = count, True
        count = 0
        for rid, new in tokens:
            output = self.outputs.get(rid)
            if output is None:
                continue
            if output.first_token_at is None:
                metrics.ttft.observe(now - output.arrived)
            else:
                metrics.itl.observe((now - output.last_token_at) / len(new))
            count += len(new)
            output.push(new, now, logprobs.get(rid))
        metrics.generation_tokens.inc(count)
        for rid, reason, (prompt, completion, hit), error in ends:
            output = self.outputs.pop(rid, None)
            # (a stop string's end is the abort this process sent the engine: a stop all the same)
            stopped = output is not None and output.stopped and reason == "abort"
            metrics.finished.labels("stop" if stopped else reason).inc()
            metrics.prompt_tokens.inc(prompt)
            metrics.cached_tokens.inc(hit)
            if output is not None:
                output.cached_tokens = hit  # the engine's own count (as /metrics has it)
                output.end(
                    reason, {"prompt_tokens": prompt, "completion_tokens": completion}, error
                )
        for reason, count in refused.items():
            metrics.refusals.labels(reason).inc(count)
        for seconds in step_s:
            metrics.step.observe(seconds)
        metrics.engine_state(state)
        self.engine_waiting, self._unseen = state["waiting"], 0

    def model_card(self, name: str) -> dict:
        return {
            "id": name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "workbench",
            "root": self.limits.model,
            "max_model_len": self.limits.max_seq_len,
        }
