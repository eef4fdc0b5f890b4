"""Sampling by the exponential race ``argmax(logits / T - log E)``, ``E ~ Exp(1)``: an exact draw
from the softmax without computing it. A seeded request's noise is keyed by (seed, output index),
so its tokens do not depend on the rest of the batch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from ..core import Req
from ..device import send_arrays, to_device, to_host

PROMPT_SLICE = 256  # prompt positions whose log-softmax is taken at once (float32: 155 MB at 152k)


@dataclass
class SamplingArgs:
    all_greedy: bool
    greedy: torch.Tensor | None = None  # [batch] bool; None if no row is greedy
    temperatures: torch.Tensor | None = None  # [batch], 1 where greedy
    top_k: torch.Tensor | None = None  # [batch] int64, vocab size where off; None if all off
    top_p: torch.Tensor | None = None
    seeded: list[tuple[int, int]] | None = None  # (row, generator key)
    keys: torch.Tensor | None = None  # [batch] Philox keys; set when the fused kernel samples
    # `SamplingParams.logit_bias` of the rows with one: (rows, token ids, biases), added to the
    # logits before anything else (int64, int64, float32 [entries]); None: no row has one
    bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    # the penalized rows (`SamplingParams.penalized`): applied before the bias (`Penalties`)
    penalties: Penalties | None = None


class Penalties(NamedTuple):
    """The penalized rows of a batch: which rows, their requests' rows of the token pool and
    where their outputs start and their tokens end there (the device knows them all by the time
    it samples, overlap or not), and their penalties (float32)."""

    rows: torch.Tensor  # int64 [k]
    table_rows: torch.Tensor  # int64 [k]
    prompt_lens: torch.Tensor  # int64 [k]
    ends: torch.Tensor  # int64 [k]: tokens before the one sampled
    presence: torch.Tensor
    frequency: torch.Tensor
    repetition: torch.Tensor
    span: int  # the largest end (read on the host, so no step waits for it)


class _Rows(NamedTuple):
    """What sampling needs of a batch's requests that does not change while they run."""

    reqs: list[Req]
    all_greedy: bool
    greedy: np.ndarray
    temperatures: np.ndarray
    top_k: np.ndarray | None
    top_p: np.ndarray | None
    seeded: np.ndarray  # a seed of its own (and not greedy)
    seeds: np.ndarray
    prompt_lens: np.ndarray
    any_seeded: bool
    key_seeds: np.ndarray  # the seed each row's key mixes (its own, or the engine's)
    rows: np.ndarray
    logprob_rows: np.ndarray | None  # the rows that report log probabilities; None: none
    top_logprobs: int  # the most likely tokens the most of them asks for
    bias: tuple[np.ndarray, np.ndarray, np.ndarray] | None  # as `SamplingArgs.bias`, on the host
    penalized: np.ndarray | None  # the rows with a penalty; None: none


class Sampler:
    def __init__(
        self,
        vocab_size: int,
        device: torch.device,
        seed: int,
        fused: bool = False,
        token_pool: torch.Tensor | None = None,
    ):
        """`token_pool`: the request table's tokens (`TableManager.token_pool`), which
        penalties count."""
        self.vocab_size, self.device = vocab_size, device
        self.token_pool = token_pool
        self.seed = seed
        self.generator = torch.Generator(device).manual_seed(seed)
        self.fused = fused  # the one-pass Triton kernel, for batches without top-k / top-p
        self._calls = 0  # keys the unseeded rows' noise in the fused kernel
        self._rows: _Rows | None = None

    def _rows_of(self, reqs: list[Req]) -> _Rows:
        if self._rows is not None and self._rows.reqs == reqs:  # by identity (eq=False)
            return self._rows
        params = [r.sampling for r in reqs]
        greedy = np.array([p.is_greedy for p in params], dtype=bool)
        top_k = [p.top_k if p.top_k > 0 else self.vocab_size for p in params]
        top_p = [p.top_p for p in params]
        seeded = np.array([p.seed is not None for p in params], dtype=bool) & ~greedy
        seeds = np.array([(p.seed or 0) % 2**64 for p in params], dtype=np.uint64)
        wants = [i for i, p in enumerate(params) if p.logprobs is not None]
        adjusted = [i for i, p in enumerate(params) if p.adjusts_logits]
        penalized = [i for i in adjusted if params[i].penalized]
        self._rows = _Rows(
            reqs=list(reqs),
            all_greedy=bool(greedy.all()),
            greedy=greedy,
            temperatures=np.array([p.temperature for p in params], dtype=np.float32) * ~greedy,
            top_k=np.array(top_k, dtype=np.int64) if min(top_k) < self.vocab_size else None,
            top_p=np.array(top_p, dtype=np.float32) if min(top_p) < 1.0 else None,
            seeded=seeded,
            seeds=seeds,
            prompt_lens=np.array([r.prompt_len for r in reqs], dtype=np.int64),
            any_seeded=bool(seeded.any()),
            key_seeds=np.where(seeded, seeds, np.uint64(self.seed % 2**64)),
            rows=np.arange(len(reqs), dtype=np.uint64),
            logprob_rows=np.array(wants, dtype=np.int64) if wants else None,
            top_logprobs=max((params[i].logprobs for i in wants), default=0),
            bias=_bias_entries(params, adjusted),
            penalized=np.array(penalized, dtype=np.int64) if penalized else None,
        )
        return self._rows

    def _penalties(self, rows: _Rows, device_lens: np.ndarray) -> Penalties | None:
        at = rows.penalized
        if at is None:
            return None
        if self.token_pool is None:
            raise RuntimeError("penalties need the sampler's token_pool")
        params = [rows.reqs[i].sampling for i in at]
        ends = device_lens[at].astype(np.int64) - 1
        tensors = send_arrays(
            [
                at.astype(np.int64),
                np.array([rows.reqs[i].table_idx for i in at], dtype=np.int64),
                rows.prompt_lens[at],
                ends,
                np.array([p.presence_penalty for p in params], dtype=np.float32),
                np.array([p.frequency_penalty for p in params], dtype=np.float32),
                np.array([p.repetition_penalty for p in params], dtype=np.float32),
            ],
            self.device,
        )
        return Penalties(*tensors, span=int(ends.max()))

    def _bias(self, rows: _Rows) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        if rows.bias is None:
            return None
        at, tokens, values = send_arrays(list(rows.bias), self.device)
        return at, tokens, values

    def logprob_rows(self, reqs: list[Req]) -> tuple[np.ndarray, int] | None:
        """The rows of `reqs` that report log probabilities, and the most likely tokens the
        most of them asks for; None: none does."""
        if not reqs:
            return None
        rows = self._rows_of(reqs)
        return None if rows.logprob_rows is None else (rows.logprob_rows, rows.top_logprobs)

    def logprobs(
        self, logits: torch.Tensor, tokens: torch.Tensor, rows: np.ndarray, top: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The log-softmax of `logits` (the model's: before temperature, top-k and top-p) in the
        rows `rows`: at `tokens` (float32 [rows]) and its `top` largest (float32 and int64
        [rows, top]), enqueued to the host (read them after the step's end)."""
        if len(rows) < logits.shape[0]:
            index = to_device(rows, self.device)
            logits, tokens = logits[index], tokens[index]
        return _log_softmax_at(logits, tokens.long(), top)

    def prompt_logprobs(
        self, logits: torch.Tensor, targets: np.ndarray, top: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """As `logprobs`, for prompt positions: each row's at its `targets` token (the
        prompt's next)."""
        return _log_softmax_at(logits, to_device(targets, self.device), top)

    def prepare(self, reqs: list[Req], device_lens: np.ndarray | None = None) -> SamplingArgs:
        """The sampling of `reqs`, whose forward has run. `device_lens`: theirs, if at hand."""
        if not reqs:
            return SamplingArgs(all_greedy=True)
        rows = self._rows_of(reqs)
        if device_lens is None:
            device_lens = np.array([r.device_len for r in reqs], dtype=np.int64)
        penalties = self._penalties(rows, device_lens)
        if rows.all_greedy:
            return SamplingArgs(all_greedy=True, bias=self._bias(rows), penalties=penalties)
        # NOTE: keyed by the sampled token's index, which the device side knows (overlap)
        outputs = device_lens - 1 - rows.prompt_lens
        if self.fused and rows.top_k is None and rows.top_p is None:
            return self._prepare_fused(rows, outputs, penalties)
        dev = self.device
        args = SamplingArgs(
            all_greedy=False,
            bias=self._bias(rows),
            penalties=penalties,
            greedy=to_device(rows.greedy, dev, torch.bool) if rows.greedy.any() else None,
            temperatures=to_device(
                np.where(rows.greedy, np.float32(1.0), rows.temperatures), dev, torch.float32
            ),
        )
        if rows.top_k is not None:
            args.top_k = to_device(rows.top_k, dev)
        if rows.top_p is not None:
            args.top_p = to_device(rows.top_p, dev, torch.float32)
        args.seeded = [
            (i, _mix(int(rows.seeds[i]), int(outputs[i]))) for i in np.flatnonzero(rows.seeded)
        ]
        return args

    def race_inputs(
        self, reqs: list[Req], device_lens: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """Temperatures (0: greedy) and Philox keys for the one-pass kernel; None if it can't."""
        if not self.fused:
            return None
        rows = self._rows_of(reqs)
        if rows.top_k is not None or rows.top_p is not None:
            return None
        if rows.bias is not None or rows.penalized is not None:
            return None
        if rows.all_greedy:  # a plain argmax: no key needed
            return rows.temperatures, np.zeros(len(reqs), dtype=np.int64)
        return rows.temperatures, self._keys(rows, device_lens - 1 - rows.prompt_lens)

    def _keys(self, rows: _Rows, outputs: np.ndarray) -> np.ndarray:
        """One Philox key per row: (seed, output index) if seeded, else (engine seed, call, row)."""
        self._calls += 1
        # NOTE: the top bit keeps an unseeded row's counter apart from any output index.
        counters = rows.rows + np.uint64(1 << 63 | self._calls << 20)
        if rows.any_seeded:
            counters[rows.seeded] = outputs[rows.seeded].astype(np.uint64)
        return philox_keys(rows.key_seeds, counters)

    def _prepare_fused(
        self, rows: _Rows, outputs: np.ndarray, penalties: Penalties | None
    ) -> SamplingArgs:
        temperatures, keys = send_arrays(
            [rows.temperatures, self._keys(rows, outputs)], self.device
        )
        return SamplingArgs(
            all_greedy=False,
            temperatures=temperatures,
            keys=keys,
            bias=self._bias(rows),
            penalties=penalties,
        )

    def sample(self, logits: torch.Tensor, args: SamplingArgs) -> torch.Tensor:
        """logits [batch, vocab] -> token ids [batch] int32."""
        # NOTE: new tensors from here: the caller's logits give the log probabilities
        if args.penalties is not None:
            logits = _penalize(logits, args.penalties, self.token_pool)
        if args.bias is not None:
            at, tokens, values = args.bias
            logits = logits.index_put((at, tokens), values.to(logits.dtype), accumulate=True)
        if args.all_greedy:
            return logits.argmax(-1).to(torch.int32)
        if args.keys is not None:
            from ..kernels.sampling import race_sample

            return race_sample(logits, args.temperatures, args.keys).to(torch.int32)
        greedy = None if args.greedy is None else logits.argmax(-1)
        logits = logits / args.temperatures[:, None]
        sampled = self._exponential_race(logits, args)
        if greedy is not None:
            sampled = torch.where(args.greedy, greedy, sampled)
        return sampled.to(torch.int32)

    def _exponential_race(self, logits: torch.Tensor, args: SamplingArgs) -> torch.Tensor:
        """argmax(logits - log E): `logits` already divided by the temperatures (and owned)."""
        if args.top_k is not None or args.top_p is not None:
            logits = _mask_top_k_top_p(logits, args.top_k, args.top_p)
        noise = _exponential(logits.shape, self.generator, logits.device)
        for row, key in args.seeded:
            gen = torch.Generator(logits.device).manual_seed(key)
            noise[row] = _exponential(logits.shape[1:], gen, logits.device)
        return logits.sub_(noise.log_()).argmax(-1)


def _penalize(logits: torch.Tensor, p: Penalties, token_pool: torch.Tensor) -> torch.Tensor:
    """`logits` with the penalized rows' penalties applied (a new tensor), in float32: Hugging
    Face's repetition penalty over the prompt and output, then OpenAI's frequency and presence
    penalties over the output, each counted from the token pool. Works on the tokens a row
    holds ([k, span]), not on its whole vocabulary: one float32 copy of the rows, where counting
    into [k, vocab] tensors took several."""
    tokens = token_pool[p.table_rows, : p.span].long()  # [k, span]
    position = torch.arange(p.span, device=logits.device)[None, :]
    known = position < p.ends[:, None]
    output = known & (position >= p.prompt_lens[:, None])
    # NOTE: a position past its request's end stands for the request's first token (every
    # request has one), so it writes the very value that position writes
    index = torch.where(known, tokens, tokens[:, :1])
    # how often each position's token is among the row's output: its run in the sorted output
    ordered = torch.where(output, tokens, -1).sort(dim=1).values  # -1: not output, sorts first
    counts = torch.searchsorted(ordered, index, right=True) - torch.searchsorted(ordered, index)
    counts = counts.float()
    rows = logits[p.rows].float()
    held = rows.gather(1, index)  # the logit of each position's token
    repetition = p.repetition[:, None]
    value = torch.where(held > 0, held / repetition, held * repetition)
    value = value - p.frequency[:, None] * counts - p.presence[:, None] * (counts > 0)
    # a token held at several positions gets the same value from each
    rows.scatter_(1, index, value)
    return logits.index_put((p.rows,), rows.to(logits.dtype))


def _bias_entries(
    params: list, rows: list[int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The `logit_bias` of `rows` of `params` as (rows, token ids, biases); None when none of
    them has one."""
    entries = [
        (row, token, value)
        for row in rows
        for token, value in (params[row].logit_bias or {}).items()
    ]
    if not entries:
        return None
    at, tokens, values = zip(*entries)
    return (
        np.array(at, dtype=np.int64),
        np.array(tokens, dtype=np.int64),
        np.array(values, dtype=np.float32),
    )


def _mask_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None
) -> torch.Tensor:
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    rank = torch.arange(logits.shape[-1], device=logits.device)[None, :]
    drop = torch.zeros_like(sorted_logits, dtype=torch.bool)
    if top_k is not None:
        drop |= rank >= top_k[:, None]
    if top_p is not None:
        probs = torch.softmax(sorted_logits.masked_fill(drop, float("-inf")), dim=-1)
        # keep the smallest head of the distribution whose mass reaches top_p (at least one token)
        # (the first always: a top_p that rounds to 0 in float32 must not drop every token)
        drop |= ((probs.cumsum(-1) - probs) >= top_p[:, None]) & (rank > 0)
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


def _mix(seed: int, index: int) -> int:
    return (seed * 0x9E3779B1 + index * 0x85EBCA77 + 1) % (2**63 - 1)


def _exponential(shape, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """Exp(1) noise: one kernel on a GPU; on a CPU -log(U) is faster than exponential_."""
    if device.type == "cuda":
        return torch.empty(shape, device=device).exponential_(generator=generator)
    return torch.rand(shape, generator=generator, device=device).log_().neg_()


# NOTE: numpy scalars made once: one made per call costs as much as the array operation
_GOLDEN, _MUL1, _MUL2 = (
    np.uint64(c) for c in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB)
)
_S30, _S27, _S31, _S1 = (np.uint64(s) for s in (30, 27, 31, 1))


def philox_keys(seeds: np.ndarray, counters: np.ndarray) -> np.ndarray:
    """63-bit keys from (seed, counter) pairs: splitmix64, vectorised (wrapping modulo 2**64)."""
    x = seeds.astype(np.uint64) * _GOLDEN
    x += counters.astype(np.uint64, copy=False)
    x ^= x >> _S30
    x *= _MUL1
    x ^= x >> _S27
    x *= _MUL2
    x ^= x >> _S31
    x >>= _S1
    return x.view(np.int64)


def _log_softmax_at(
    logits: torch.Tensor, targets: torch.Tensor, top: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The log-softmax of each row of `logits` in float32 at its `targets` column (int64) and its
    `top` largest (values and columns), enqueued to the host; `PROMPT_SLICE` rows at a time (a
    float32 copy of a prompt's every position could be gigabytes)."""
    out = []
    for start in range(0, logits.shape[0], PROMPT_SLICE):
        rows = torch.log_softmax(logits[start : start + PROMPT_SLICE].float(), dim=-1)
        chosen = rows.gather(1, targets[start : start + PROMPT_SLICE, None])[:, 0]
        values, ids = rows.topk(top, dim=-1)
        out.append((chosen, values, ids))
    return tuple(to_host(torch.cat(parts)) for parts in zip(*out))
