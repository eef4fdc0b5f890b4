"""Offline generation: `LLM(...).generate(prompts, sampling)` on top of the scheduler."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from . import validate as V
from .config import SCHEDULER_SETTINGS, EngineConfig
from .core import Req, SamplingParams, ceil_page
from .engine.engine import Engine
from .instrument.probe import Probe
from .scheduler.outcome import StepOutcome
from .scheduler.scheduler import Scheduler

Prompt = str | Sequence[int]


class LLM:
    """A model behind the scheduler, for offline batch generation.

    `overlap` (default: on for CUDA) launches each batch before the previous one is processed;
    `record` ("off", "light", "full") keeps step records in `llm.scheduler.history`; any other
    keyword is an `EngineConfig` field (`cuda_graph`, `max_seq_len`, `share_threshold`, ...).

    ``LLM("smollm2").generate(["Hello"], SamplingParams(max_tokens=8))`` returns one dict per
    prompt, in input order, with ``token_ids``, ``text``, ``finish_reason``, ``prompt_tokens``,
    ``completion_tokens`` and ``cached_tokens``.
    """

    def __init__(
        self,
        model: str = "smollm2",
        device: str | None = None,
        dtype: Any = None,
        page_size: int = 1,
        max_extend_tokens: int = 8192,
        cache: str = "radix",
        max_running_reqs: int = 256,
        num_pages: int | None = None,
        overlap: bool | None = None,
        record: str = "off",
        **engine_options: Any,
    ) -> None:
        probe = Probe(record)  # checks the level before anything is loaded
        self.config = EngineConfig(
            model=model,
            device=device,
            dtype=dtype,
            page_size=page_size,
            max_extend_tokens=max_extend_tokens,
            cache=cache,
            max_running_reqs=max_running_reqs,
            num_pages=num_pages,
            overlap=overlap,
            **engine_options,
        )
        self.config.torch_dtype  # noqa: B018 (validates the dtype before anything is loaded)
        self.engine = Engine(self.config)
        self.tokenizer = _load_tokenizer(self.engine.model_dir)
        probe.device = self.engine.device
        self.scheduler = Scheduler(self.engine, probe)

    def reconfigure(self, record: str | None = None, **settings: Any) -> None:
        """Change the scheduler's settings (`max_extend_tokens`, `policy`, `cache`, `overlap`,
        `share_threshold`) and the record level, keeping the loaded engine: the same weights,
        KV pool and CUDA graphs. Only while nothing is waiting or running; the prefix cache
        starts empty, hooks stay. ``llm.reconfigure(max_extend_tokens=64, policy="mixed")``."""
        engine_only = sorted(set(settings) - set(SCHEDULER_SETTINGS))
        if engine_only:
            raise ValueError(
                f"reconfigure changes {SCHEDULER_SETTINGS} and record; {engine_only} belong to "
                "the engine: build a new LLM for those"
            )
        old = self.scheduler
        record = old.record if record is None else record
        probe = Probe(record, hooks=old.hooks, device=self.engine.device)  # checks the level
        config = self.config.with_(**settings)  # validates
        if not old.is_idle:
            raise RuntimeError(
                "reconfigure needs an idle engine: requests are waiting or running "
                "(finish them, abort them, or reset)"
            )
        old.abort_all()  # lets go of the prefix cache's pages
        self.scheduler = Scheduler(self.engine, probe, config=config)
        self.config = config

    def run_meta(self) -> dict:
        """The settings a saved run carries with it."""
        config, engine = self.config, self.engine
        return {
            "model": config.model,
            "device": str(engine.device),
            "dtype": str(engine.dtype).removeprefix("torch."),
            "page_size": config.page_size,
            "max_extend_tokens": config.max_extend_tokens,
            "cache": config.cache,
            "policy": config.policy,
            "max_running_reqs": config.max_running_reqs,
            "num_pages": engine.num_pages,
            "overlap": self.scheduler.overlap,
            "cuda_graph": config.cuda_graph_enabled,
            "record": self.scheduler.record,
        }

    # -- requests ---------------------------------------------------------------------------
    def encode(self, prompt: Prompt, index: int = 0) -> list[int]:
        """Token ids of a prompt: a string, or token ids (a list, tuple or 1-d integer array)
        checked against the vocabulary."""
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError(f"prompt {index} is empty")
            try:
                prompt.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise ValueError(f"prompt {index} is not valid text: {exc}") from None
            return self.tokenizer(prompt).input_ids
        return V.token_ids(f"prompt {index}", prompt, self.engine.model_config.vocab_size)

    def check_request(self, token_ids: list[int], sampling: SamplingParams, index: int = 0) -> None:
        """Raise TypeError or ValueError if this request could never run; takes nothing."""
        if not isinstance(sampling, SamplingParams):
            raise TypeError(
                f"sampling for prompt {index} must be a SamplingParams, got {sampling!r}"
            )
        if not token_ids:
            raise ValueError(f"prompt {index} is empty")
        total = len(token_ids) + sampling.max_tokens
        if total > self.engine.max_seq_len:
            raise ValueError(
                f"prompt {index} has {len(token_ids)} tokens; with "
                f"max_tokens={sampling.max_tokens} that is {total}, longer than the context "
                f"of {self.engine.max_seq_len} tokens"
            )
        need = ceil_page(total, self.config.page_size)
        capacity = self.scheduler.cache.total_size
        if need > capacity:
            raise ValueError(
                f"prompt {index} needs {need} KV slots (prompt {len(token_ids)} + max_tokens "
                f"{sampling.max_tokens}), more than the KV pool can ever hold ({capacity}); "
                "raise num_pages or lower max_tokens"
            )

    def add_requests(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling: SamplingParams | Sequence[SamplingParams] | None,
    ) -> list[int]:
        """Validate every prompt, then queue them all (nothing is queued if one is bad)."""
        prompts = V.prompt_batch(prompts)
        if sampling is None:
            sampling = SamplingParams()
        if isinstance(sampling, SamplingParams):
            params = [sampling] * len(prompts)
        elif isinstance(sampling, list | tuple) and all(
            isinstance(p, SamplingParams) for p in sampling
        ):
            params = list(sampling)
        else:
            raise TypeError(
                "sampling must be a SamplingParams, a list of them (one per prompt) or None, "
                f"got {sampling!r}"
            )
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling params")
        requests = []
        for i, (prompt, sp) in enumerate(zip(prompts, params)):
            ids = self.encode(prompt, i)
            self.check_request(ids, sp, i)
            requests.append((ids, sp))
        return [self.scheduler.add_request(ids, sp) for ids, sp in requests]

    # -- generation -------------------------------------------------------------------------
    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling: SamplingParams | Sequence[SamplingParams] | None = None,
        on_step: Callable[[StepOutcome], None] | None = None,
    ) -> list[dict]:
        """Generate for every prompt; one dict per prompt, in input order.

        All or nothing: if anything raises meanwhile (a step, a hook, `on_step`), every request
        of this call ends, what they hold is freed, and the exception reaches the caller; the
        engine keeps serving."""
        V.callable_or_none("on_step", on_step)
        uids = self.add_requests(prompts, sampling)
        try:
            pending = set(uids)
            while pending:
                outcome = self.scheduler.step()
                if outcome is None:
                    break
                if on_step is not None:
                    on_step(outcome)
                pending.difference_update(r.uid for r in outcome.finished)
                self.scheduler.hooks.raise_pending()
            # overlap: a batch launched after the last one we needed may still be in flight
            outcome = self.scheduler.flush()
            if outcome is not None and on_step is not None:
                on_step(outcome)
            self.scheduler.hooks.raise_pending()
        except BaseException:
            self._drop(uids)
            raise
        return [self.output(self.scheduler.finished.pop(uid)) for uid in uids]

    def _drop(self, uids: list[int]) -> None:
        """End the requests of a call that failed: abort those still waiting or running, let
        the batch in flight finish, and forget them all."""
        sched = self.scheduler
        for uid in uids:
            if uid not in sched.finished:
                with contextlib.suppress(ValueError):  # not waiting or running any more
                    sched.abort(uid)
        with contextlib.suppress(Exception):  # a failure there frees that batch itself
            sched.flush()
        for uid in uids:
            sched.finished.pop(uid, None)
        sched.hooks.clear_pending()

    def output(self, req: Req) -> dict:
        ids = req.token_ids[req.prompt_len :]
        return {
            "uid": req.uid,
            "token_ids": ids,
            "text": self.decode(ids),
            "finish_reason": req.finish_reason,
            "error": req.error,  # what failed, when finish_reason is "error"
            "prompt_tokens": req.prompt_len,
            "completion_tokens": len(ids),
            "cached_tokens": req.cached_tokens,
        }

    def decode(self, token_ids: list[int]) -> str:
        known = len(self.tokenizer)
        return self.tokenizer.decode([t for t in token_ids if t < known], skip_special_tokens=True)

    def check_integrity(self) -> None:
        self.scheduler.check_integrity()


def _load_tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)
