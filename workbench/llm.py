"""Offline generation on top of the scheduler.

    llm = LLM("smollm2")
    outputs = llm.generate(["Hello"], SamplingParams(max_tokens=8))

One dict per prompt, in input order: ``token_ids``, ``text``, ``finish_reason``, token counts.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import validate as V
from .config import SCHEDULER_SETTINGS, EngineConfig, engine_keywords, unknown_keyword
from .core import Req, SamplingParams, check_request, encode_prompt, sampling_batch
from .device import device_name
from .engine.engine import Engine
from .engine.ranks import torchrun_rank
from .history.history import History
from .history.roofline import Roofline
from .instrument.hooks import HookRegistry
from .instrument.other_ranks import OtherRanks
from .instrument.probe import Probe
from .instrument.window import KEEP, profile_window
from .scheduler.record import StepRecord
from .scheduler.scheduler import Scheduler
from .scheduler.warmup import WarmUp, warm_up
from .serve import MAX_QUEUED_REQUESTS, Host, Server
from .twin.build import build_twin, check_twin_request, twin_meta, twin_settings
from .twin.costs import StepCosts

Prompt = str | Sequence[int]


class LLM:
    """A model behind the scheduler, for offline batch generation.

    `record` ("off", "light", "full") keeps step records in `llm.history`; `profile_steps` and
    `max_profiled_steps` choose the steps the profiler records; `step_costs` builds a twin that
    loads no weights and predicts step times; other keywords are `EngineConfig` fields.
    """

    def __init__(
        self,
        model: str = "smollm2",
        device: str | None = None,
        dtype: Any = None,
        page_size: int | None = None,
        max_extend_tokens: int = 8192,
        cache: str = "radix",
        max_running_reqs: int = 256,
        num_pages: int | None = None,
        overlap: bool | None = None,
        record: str = "off",
        profile_steps: Any = None,
        max_profiled_steps: int | None = None,
        step_costs: StepCosts | None = None,
        **engine_options: Any,
    ) -> None:
        unknown = sorted(set(engine_options) - set(engine_keywords()))
        if unknown:
            own = ("record", "profile_steps", "max_profiled_steps", "step_costs")
            raise unknown_keyword(unknown[0], "LLM", (*engine_keywords(), *own))
        window = profile_window(profile_steps, max_profiled_steps)
        probe = Probe(record, profile_steps=window)
        options = dict(device=device, dtype=dtype, page_size=page_size, overlap=overlap)
        options.update(num_pages=num_pages, **engine_options)
        if step_costs is not None:
            options = twin_settings(step_costs, model, options)
        self.config = EngineConfig(
            model=model,
            max_extend_tokens=max_extend_tokens,
            cache=cache,
            max_running_reqs=max_running_reqs,
            **options,
        )
        self.config.torch_dtype  # noqa: B018 (validates the dtype before loading)
        self.step_costs = step_costs
        self.warmup: WarmUp | None = None
        self.server: Server | None = None
        clock = None  # a twin's predicted time, else the host's
        if step_costs is None:
            self.engine = self._build_engine(probe)
        else:
            self.engine, probe, clock = build_twin(self.config, step_costs, record, window)
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(self.engine.model_dir)
        probe.restart()
        self.scheduler = Scheduler(self.engine, probe, clock=clock)
        self._stamp()

    def _build_engine(self, probe: Probe) -> Engine:
        # NOTE: torchrun's ranks 1.. serve here and never return
        if (torchrun_rank(self.config) or 0) > 0:
            # NOTE: imported here, so that `import workbench` leaves the module that ranks run
            # with `python -m` (`engine/ranks.py`) unimported: runpy warns otherwise
            from .engine.worker import serve_under_torchrun

            serve_under_torchrun(self.config)
        engine = Engine(self.config)
        self.warmup = warm_up(engine) if self.config.warmup else None
        probe.device = engine.device
        probe.roofline = Roofline.for_engine(
            engine.model_config, engine.dtype, engine.device, engine.num_devices
        )
        probe.ranks = OtherRanks(engine.rank_device_ms, engine.rank_events)
        return engine

    def _stamp(self) -> None:
        probe = self.scheduler.probe
        probe.meta = self.run_meta()
        probe.history.meta.update(probe.meta)

    def reconfigure(self, record: str | None = None, **settings: Any) -> None:
        """Change scheduler settings (`SCHEDULER_SETTINGS`), `record` and the profile window,
        keeping the loaded engine. Only while idle; a new run starts (history, outputs and uids
        over again, the prefix cache empty), hooks stay.
        ``llm.reconfigure(max_extend_tokens=64, policy="mixed")``."""
        probe, config = self._checked(record, settings)
        self.check_not_serving("reconfigure")
        old = self.scheduler
        if not old.is_idle:
            raise RuntimeError(
                "reconfigure needs an idle engine: requests are waiting or running "
                "(finish them, abort them, or reset)"
            )
        old.abort_all()
        self.scheduler = Scheduler(self.engine, probe, config=config, clock=old.clock)
        self.config = config
        self._stamp()

    def settings(self) -> dict[str, Any]:
        """What `reconfigure` changes, as it stands: ``reconfigure(**llm.settings())`` brings
        them back after other settings."""
        probe = self.check_open().scheduler.probe
        return {
            **{name: getattr(self.config, name) for name in SCHEDULER_SETTINGS},
            "record": probe.record,
            "profile_steps": probe.window,
            "max_profiled_steps": probe.window.max_steps,
        }

    def check_settings(self, **settings: Any) -> None:
        """Raise TypeError or ValueError if `reconfigure(**settings)` would; changes nothing."""
        self._checked(settings.pop("record", None), settings)

    def _checked(self, record, settings: dict) -> tuple[Probe, EngineConfig]:
        window = settings.pop("profile_steps", KEEP), settings.pop("max_profiled_steps", KEEP)
        unknown = sorted(set(settings) - set(engine_keywords()))
        if unknown:
            taken = (*SCHEDULER_SETTINGS, "record", "profile_steps", "max_profiled_steps")
            raise unknown_keyword(unknown[0], "reconfigure", taken)
        engine_only = sorted(set(settings) - set(SCHEDULER_SETTINGS))
        if engine_only:
            raise ValueError(
                f"reconfigure changes {SCHEDULER_SETTINGS}, record and the profile window; "
                f"{engine_only} belong to the engine: build a new LLM for those"
            )
        old = self.check_open().scheduler.probe
        record = old.record if record is None else record
        probe = old.like(record, old.window.with_(*window))
        config = self.config.with_(**settings)
        built = self.engine.config.max_running_reqs
        if config.max_running_reqs > built:
            raise ValueError(
                f"max_running_reqs={config.max_running_reqs} is more than this engine was built "
                f"for ({built}: its request table and CUDA graphs are sized for it); build a "
                "new LLM for more"
            )
        return probe, config

    def serve(
        self,
        port: int = 8000,
        host: str = "127.0.0.1",
        served_model_name: str | None = None,
        max_queued_requests: int = MAX_QUEUED_REQUESTS,
        stream_interval: int = 1,
    ):
        """Serve OpenAI-compatible HTTP clients on `host`:`port` (0: any free port) from a
        thread; returns the `Server` at once. Needs the `serve` extra."""
        self._check_can_serve()
        scheduler = lambda: self.scheduler  # noqa: E731 (reconfigure replaces it)
        step = lambda: scheduler().step() or scheduler().flush()  # noqa: E731
        server = Server(
            Host(self, step, lambda: scheduler().is_idle),
            port,
            host,
            served_model_name,
            max_queued_requests,
            stream_interval,
        )
        self.server = server.start()
        return server

    def _check_can_serve(self) -> None:
        self.check_open()
        if self.server is not None:
            raise RuntimeError(f"already serving ({self.server.url}): stop_serving() first")
        if self.step_costs is not None:
            raise ValueError("a twin (step_costs) predicts step times: it has no tokens to serve")

    def stop_serving(self) -> None:
        """End the HTTP server; requests in flight end with finish_reason "abort"."""
        server, self.server = self.server, None
        if server is not None:
            server.stop()

    def check_not_serving(self, what: str) -> None:
        """Raise while a server's thread steps the engine (it is not shared)."""
        if self.server is not None:
            raise RuntimeError(
                f"{what} while this engine serves HTTP clients ({self.server.url}): "
                "stop_serving() first"
            )

    def close(self) -> None:
        """Free the engine's memory; the LLM cannot generate after."""
        if self.engine is None:
            return
        self.stop_serving()
        self.scheduler.abort_all()
        self.scheduler.close()
        cuda = self.engine.device.type == "cuda"
        self.engine.close()
        self.engine = self.scheduler = None
        if cuda:  # graphs and their memory pools in cycles; then the allocator's cache given back
            gc.collect()
            torch.cuda.empty_cache()
        # NOTE: on the CPU what the engine held is freed as it is dropped (a test checks), with no
        # full collection, slow where a process holds many objects (docs/performance.md)

    def check_open(self) -> LLM:
        """This LLM, or a RuntimeError when it was closed."""
        if self.engine is None:
            raise RuntimeError(
                "this LLM was closed (close() gave its memory back); build a new one"
            )
        return self

    @property
    def is_open(self) -> bool:
        return self.engine is not None

    @property
    def hooks(self) -> HookRegistry:
        """The hook registry: functions called at each hook point."""
        return self.check_open().scheduler.probe.hooks

    @property
    def history(self) -> History:
        """Every step record of the run so far, and the tables built from them."""
        return self.check_open().scheduler.probe.history

    @property
    def record(self) -> str:
        """What each step keeps: "off", "light" or "full"."""
        return self.scheduler.probe.record

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def warmup_ms(self) -> float:
        """What the engine's warm-up took (0: none)."""
        return 0.0 if self.warmup is None else self.warmup.ms

    def run_meta(self) -> dict:
        """The settings a saved run carries with it."""
        config, engine = self.config, self.engine
        # the model and every scheduler setting but overlap (resolved below): what a run ran
        names = ("model", "page_size", *(n for n in SCHEDULER_SETTINGS if n != "overlap"))
        meta = {
            **{name: getattr(config, name) for name in names},
            "device": str(engine.device),
            "device_name": device_name(engine.device),
            "dtype": str(engine.dtype).removeprefix("torch."),
            "tp_size": config.tp_size,
            "num_pages": engine.num_pages,
            "overlap": self.scheduler.overlap,
            "cuda_graph": engine.captures_graphs,  # (asked for, with no capturable backend: off)
            "cuda_graph_max_bs": config.cuda_graph_max_bs,
            "cuda_graph_max_tokens": config.cuda_graph_max_tokens,
            "kernels": engine.kernels,
            "record": self.record,
            "warmup_ms": round(self.warmup_ms, 1),
            **self.scheduler.probe.window.meta(),
        }
        if self.step_costs is not None:
            meta.update(twin_meta(self.step_costs, engine))
        return meta

    def encode(self, prompt: Prompt, index: int = 0) -> list[int]:
        """Token ids of a prompt (a string, or token ids checked against the vocabulary)."""
        vocab = self.engine.model_config.vocab_size
        return encode_prompt(self.tokenizer, vocab, prompt, f"prompt {index}")

    def check_request(self, token_ids: list[int], sampling: SamplingParams, index: int = 0) -> None:
        """Raise TypeError or ValueError if this request could never run; takes nothing."""
        capacity = self.scheduler.cache.total_size
        engine = self.engine
        vocab = engine.model_config.vocab_size
        check_request(
            token_ids,
            sampling,
            index,
            engine.max_seq_len,
            self.config.page_size,
            capacity,
            vocab,
            engine.tp.size,
        )
        if self.step_costs is not None:
            check_twin_request(sampling, index)

    def add_requests(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling: SamplingParams | Sequence[SamplingParams] | None,
    ) -> list[int]:
        """Validate every prompt, then queue them all (nothing is queued if one is bad)."""
        self.check_open()
        prompts = V.prompt_batch(prompts)
        params = sampling_batch(sampling, len(prompts))
        requests = []
        for i, (prompt, sp) in enumerate(zip(prompts, params)):
            ids = self.encode(prompt, i)
            self.check_request(ids, sp, i)
            requests.append((ids, sp))
        return [self.scheduler.add_request(ids, sp) for ids, sp in requests]

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling: SamplingParams | Sequence[SamplingParams] | None = None,
        on_step: Callable[[StepRecord], None] | None = None,
    ) -> list[dict]:
        """Generate for every prompt; one dict per prompt, in input order. If anything raises,
        every request of the call is freed."""
        V.callable_or_none("on_step", on_step)
        self.check_open()
        self.check_not_serving("generate")
        uids = self.add_requests(prompts, sampling)
        self.scheduler.clock.resume()  # a workbench pauses it between calls
        try:
            pending = set(uids)
            while pending:
                record = self.scheduler.step()
                if record is None:
                    break
                if on_step is not None:
                    on_step(record)
                pending.difference_update(record.finished)
                self.hooks.raise_pending()
            # overlap: a batch launched after the last one we needed may still be in flight
            record = self.scheduler.flush()
            if record is not None and on_step is not None:
                on_step(record)
            self.hooks.raise_pending()
        except BaseException:
            self._drop(uids)
            raise
        finally:
            self.scheduler.probe.flush()
        return [self.output(self.scheduler.finished.pop(uid)) for uid in uids]

    def _drop(self, uids: list[int]) -> None:
        sched = self.scheduler
        for uid in uids:
            if uid not in sched.finished:
                with contextlib.suppress(ValueError):
                    sched.abort(uid)
        with contextlib.suppress(Exception):  # a failure there frees that batch itself
            sched.flush()
        for uid in uids:
            sched.finished.pop(uid, None)
        self.hooks.clear_pending()

    def output(self, req: Req) -> dict:
        ids = req.token_ids[req.prompt_len :]
        prompt_logprobs = req.prompt_logprobs
        return {
            "uid": req.uid,
            "token_ids": ids,
            "text": self.decode(ids),
            "finish_reason": req.finish_reason,
            "error": req.error,
            "prompt_tokens": req.prompt_len,
            "completion_tokens": len(ids),
            "cached_tokens": req.cached_tokens,
            # with SamplingParams(logprobs=n): per output token (its log probability, the n
            # most likely tokens as (token id, log probability)); else None
            "logprobs": req.logprobs,
            # with SamplingParams(prompt_logprobs=n): per prompt token, None for the first, then
            # (its log probability given those before it, the n most likely there); else None
            "prompt_logprobs": None if prompt_logprobs is None else [None, *prompt_logprobs],
        }

    def decode(self, token_ids: list[int]) -> str:
        known = len(self.tokenizer)
        return self.tokenizer.decode([t for t in token_ids if t < known], skip_special_tokens=True)

    def check_integrity(self) -> None:
        """Check the KV pool's accounting."""
        self.check_open()
        if self.server is None:
            self.scheduler.check_integrity()
            return
        with self.server.loop.lock:
            self.scheduler.check_integrity()
