"""The ledger: SamplingParams, Req (one request's progress), Batch (one forward's requests)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import numpy as np
import torch

if TYPE_CHECKING:
    from .kvcache.base import CacheHandle

Phase = Literal["prefill", "decode", "mixed"]
MIN_TEMPERATURE = 1e-5  # logits / temperature must stay finite in float32
FLOAT32_MAX = float(np.finfo(np.float32).max)


def ceil_page(n: int, page_size: int) -> int:
    return -(-n // page_size) * page_size


def floor_page(n: int, page_size: int) -> int:
    return n // page_size * page_size


def kv_tokens_needed(total_len: int, cached_len: int, page_size: int) -> int:
    """KV slots a request of `total_len` tokens (prompt + max_tokens) may still allocate after
    `cached_len` of them: the space admission reserves for it (conservative by one)."""
    return ceil_page(total_len, page_size) - ceil_page(cached_len, page_size)


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens for one request. `temperature=0` (the default) is greedy.

    Checked on construction (a TypeError or ValueError naming the field): `max_tokens` an
    integer >= 1; `temperature` 0 or a number in [1e-5, 3.4e38] (smaller ones overflow the
    logits, larger ones are infinite in float32); `top_k` -1 (off) or >= 1 (beyond the
    vocabulary it keeps every token); `top_p` in (0, 1]; `ignore_eos` a bool; `seed` None or an
    integer in [0, 2**63)."""

    max_tokens: int = 16
    temperature: float = 0.0
    top_k: int = -1  # -1: no top-k
    top_p: float = 1.0
    ignore_eos: bool = False
    seed: int | None = None  # same seed, same tokens, whatever else is in the batch

    def __post_init__(self) -> None:
        from . import validate as V

        # NOTE: logits are divided by it in float32: a larger one would be inf there
        temperature = V.real(
            "temperature",
            self.temperature,
            low=0.0,
            high=FLOAT32_MAX,
            allowed=f">= 0 and at most {FLOAT32_MAX:.4g} (the largest float32)",
        )
        if 0.0 < temperature < MIN_TEMPERATURE:
            raise ValueError(
                f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE} (smaller ones "
                f"overflow the logits), got {self.temperature!r}"
            )
        top_k = V.integer("top_k", self.top_k, -1, 2**31 - 1)
        if top_k == 0:
            raise ValueError("top_k must be -1 (off) or an integer >= 1, got 0")
        checked = dict(
            max_tokens=V.integer("max_tokens", self.max_tokens, 1),
            temperature=temperature,
            top_k=top_k,
            top_p=V.real("top_p", self.top_p, 0.0, 1.0, low_open=True),
            ignore_eos=V.boolean("ignore_eos", self.ignore_eos),
            seed=V.optional_integer("seed", self.seed, 0, 2**63 - 1),
        )
        for name, value in checked.items():  # plain Python values (numpy ints become ints)
            object.__setattr__(self, name, value)

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


@dataclass(eq=False)
class Req:
    """One admitted request: a slot in the page table, a prefix-cache handle and three lengths.

    Invariant: ``0 <= cached_len < device_len <= max_device_len``.
    - ``cached_len``: tokens whose KV is in the pool.
    - ``device_len``: tokens the device knows about (computed, or computed by the batch in flight).
    - ``max_device_len``: prompt + max_tokens.
    """

    uid: int
    token_ids: list[int]  # host view: prompt, then each sampled token once it reached the host
    prompt_len: int
    table_idx: int
    cached_len: int
    sampling: SamplingParams
    cache_handle: CacheHandle
    cached_tokens: int = 0  # prompt tokens served by the prefix cache at admission
    # by default the tokens given and prompt + max_tokens; then moved by complete_one()
    device_len: int = field(default=-1, kw_only=True)
    max_device_len: int = field(default=-1, kw_only=True)
    # "stop" | "length" | "abort" | "error", set by the scheduler
    finish_reason: str | None = field(default=None, init=False)
    error: str | None = field(default=None, init=False)  # finish_reason "error": what failed
    # KV slots its page-table row holds, in whole pages: set by prepare_batch when it allocates.
    # Between steps it is ceil_page(cached_len); only a batch in flight (or one that failed)
    # has allocated more.
    alloc_len: int = field(init=False)
    released: bool = field(default=False, init=False)  # its slot and pages were given back

    def __post_init__(self) -> None:
        if self.device_len < 0:
            self.device_len = len(self.token_ids)
        if self.max_device_len < 0:
            self.max_device_len = self.prompt_len + self.sampling.max_tokens
        self.alloc_len = self.cached_len  # admission: whole pages matched in the prefix cache
        assert 0 <= self.cached_len < self.device_len <= self.max_device_len, self

    @classmethod
    def mirror(
        cls,
        uid: int,
        table_idx: int,
        cached_len: int,
        device_len: int,
        prompt_len: int,
        max_device_len: int,
        sampling: SamplingParams,
    ) -> Req:
        """A request with these lengths and neither tokens (they are in the token pool) nor a
        cache handle: what a tensor-parallel rank runs of a step rank 0 scheduled."""
        return cls(
            uid,
            [],
            prompt_len,
            table_idx,
            cached_len,
            sampling,
            None,
            device_len=device_len,
            max_device_len=max_device_len,
        )

    @property
    def extend_len(self) -> int:
        return self.device_len - self.cached_len

    @property
    def remain_len(self) -> int:
        return self.max_device_len - self.device_len

    @property
    def output_len(self) -> int:
        return len(self.token_ids) - self.prompt_len

    @property
    def can_decode(self) -> bool:
        return self.finish_reason is None and self.remain_len > 0

    def complete_one(self) -> None:
        """Device side, right after the forward: what was computed is cached; one more opens."""
        self.cached_len = self.device_len
        self.device_len += 1

    def append_host(self, token: int) -> None:
        """Host side, once the sampled token has arrived."""
        self.token_ids.append(token)

    def end_reason(self, token: int, eos_ids: frozenset[int]) -> str | None:
        """Host side, after `append_host(token)`: "stop" at an EOS token (unless ignored),
        "length" at its last token, else None."""
        if token in eos_ids and not self.sampling.ignore_eos:
            return "stop"
        # NOTE: the host's count, not remain_len: with overlap the device side is a step ahead
        # already, and remain_len would end the request one token early.
        return "length" if len(self.token_ids) == self.max_device_len else None

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(uid={self.uid}, table_idx={self.table_idx}, "
            f"cached_len={self.cached_len}, device_len={self.device_len}, "
            f"max_device_len={self.max_device_len})"
        )


class ChunkedReq(Req):
    """A request whose prompt is only partly computed: never sampled, never decoded.

    It returns to the head of the queue and continues with the slot and cache handle it holds.
    """

    def append_host(self, token: int) -> None:
        raise RuntimeError("a ChunkedReq must not be sampled")

    @property
    def can_decode(self) -> bool:
        return False


class ReqView(NamedTuple):
    """One request's ledger as a batch launched it (a CPU snapshot, safe to keep)."""

    uid: int
    kind: str  # "chunk" | "prefill" | "decode"
    table_idx: int
    cached_len: int
    device_len: int
    max_device_len: int
    extend_len: int
    cached_tokens: int

    @classmethod
    def of(cls, req: Req, decoding: bool) -> ReqView:
        kind = "decode" if decoding else "chunk" if isinstance(req, ChunkedReq) else "prefill"
        return cls(
            req.uid,
            kind,
            req.table_idx,
            req.cached_len,
            req.device_len,
            req.max_device_len,
            req.extend_len,
            req.cached_tokens,
        )


@dataclass
class Batch:
    """The requests of one forward. Created by a manager, filled in by the scheduler and backend.

    A "mixed" batch (policy="mixed") runs its first `num_decode` requests' next tokens together
    with prefill chunks of the others, through the prefill path.
    """

    reqs: list[Req]
    phase: Phase
    num_decode: int = -1  # requests at the head that decode; -1: all for "decode", none otherwise
    # filled by prepare_batch (`snapshot`): [3, size] int64, each request's table_idx,
    # cached_len and device_len as launched (a host snapshot: the requests' own lengths move
    # on), and [size] int64, each one's max_device_len
    ledger: np.ndarray = field(init=False)
    max_lens: np.ndarray = field(init=False)
    # filled with the batch's inputs (engine/inputs.py; a CUDA graph keeps its own)
    input_ids: torch.Tensor = field(init=False)  # [num_tokens] on the device
    positions: torch.Tensor = field(init=False)  # [num_tokens]
    out_loc: torch.Tensor = field(init=False)  # [num_tokens] KV slot each new token is written to
    sample_idx: torch.Tensor = field(init=False)  # rows of the hidden states that get logits
    # filled by the attention backend's prepare()
    attn_metadata: Any = field(init=False)
    # `launched_columns()` and `launched_views()`, built when first asked for
    _columns: tuple[tuple, ...] | None = field(default=None, init=False, repr=False)
    _views: list[ReqView] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.num_decode < 0:
            self.num_decode = len(self.reqs) if self.phase == "decode" else 0
        expected = {"decode": self.num_decode == len(self.reqs), "prefill": self.num_decode == 0}
        ok = expected.get(self.phase, 0 < self.num_decode < len(self.reqs))
        assert ok, f"a {self.phase} batch with {self.num_decode} of {len(self.reqs)} decoding"

    @property
    def size(self) -> int:
        return len(self.reqs)

    @property
    def is_prefill(self) -> bool:
        """Runs the prefill path (ragged queries): "prefill" and "mixed" batches."""
        return self.phase != "decode"

    @property
    def prefill_reqs(self) -> list[Req]:
        """The requests computing prompt tokens (the chunks and whole prompts)."""
        return self.reqs[self.num_decode :]

    @property
    def num_tokens(self) -> int:
        return sum(r.extend_len for r in self.reqs)

    def views(self) -> list[ReqView]:
        """Each request's ledger now."""
        return [ReqView.of(r, i < self.num_decode) for i, r in enumerate(self.reqs)]

    def snapshot(self) -> None:
        """Keep the requests' lengths as launched (`ledger`, `max_lens`), before the forward
        moves them."""
        reqs = self.reqs
        self.ledger = np.array(
            [
                [r.table_idx for r in reqs],
                [r.cached_len for r in reqs],
                [r.device_len for r in reqs],
            ],
            dtype=np.int64,
        ).reshape(3, len(reqs))
        self.max_lens = np.array([r.max_device_len for r in reqs], dtype=np.int64)

    def launched_columns(self, like: Batch | None = None) -> tuple[tuple, ...]:
        """The `ReqView` fields of every request as the batch launched (its lengths from
        `ledger`), one tuple per field: plain ints and strings, built column by column (a
        record of 256 requests builds these several times faster than one tuple per request,
        and the garbage collector stops tracking them). Built when first asked for (records,
        hooks), not when nobody does. `like`: an earlier batch; when it ran the same requests
        in the same way (decode step after decode step), its columns that do not change while
        a request runs (uid, kind, table_idx, max_device_len, cached_tokens) are shared."""
        if self._columns is None:
            rows, cached, device = self.ledger.tolist()
            same = (
                like is not None
                and like._columns is not None
                and like.phase == self.phase
                and like.num_decode == self.num_decode
                and like.reqs == self.reqs  # the same objects, in order (eq=False: identity)
            )
            if same:
                uids, kinds, table_idx, _, _, max_lens, _, cached_tokens = like._columns
            else:
                nd, reqs = self.num_decode, self.reqs
                kinds = ["decode"] * nd
                kinds += ["chunk" if isinstance(r, ChunkedReq) else "prefill" for r in reqs[nd:]]
                uids, kinds, table_idx = tuple([r.uid for r in reqs]), tuple(kinds), tuple(rows)
                max_lens = tuple(self.max_lens.tolist())
                cached_tokens = tuple([r.cached_tokens for r in reqs])
            extend = (self.ledger[2] - self.ledger[1]).tolist()
            self._columns = (
                uids,
                kinds,
                table_idx,
                tuple(cached),
                tuple(device),
                max_lens,
                tuple(extend),
                cached_tokens,
            )
        return self._columns

    def launched_views(self) -> list[ReqView]:
        """`launched_columns()` as one `ReqView` per request."""
        if self._views is None:
            self._views = [ReqView._make(row) for row in zip(*self.launched_columns())]
        return self._views

    @property
    def sampled_reqs(self) -> list[Req]:
        if self.phase == "decode":
            return self.reqs
        return [r for r in self.reqs if not isinstance(r, ChunkedReq)]

    def sampled_mask(self) -> np.ndarray:
        """Which requests get a token (all but prompt chunks), as a bool array."""
        if self.phase == "decode":
            return np.ones(self.size, dtype=bool)
        return np.array([not isinstance(r, ChunkedReq) for r in self.reqs], dtype=bool)


# -- admission decisions ----------------------------------------------------------------
# Why a waiting request was not admitted this step.
NO_TOKEN_BUDGET = "no_token_budget"
NO_SLOT = "no_slot"
KV_FULL = "kv_full"
KV_FULL_AFTER_LOCK = "kv_full_after_lock"
QUEUED_BEHIND = "queued_behind"  # FIFO: a request ahead of it was refused
WAIT_FOR_PREFIX = "wait_for_prefix"  # shares an uncached prefix with a request in this batch
DECODE_FIRST = "decode_first"  # policy="decode_first": requests are running, so they go first
REASONS = (
    NO_TOKEN_BUDGET,
    NO_SLOT,
    KV_FULL,
    KV_FULL_AFTER_LOCK,
    QUEUED_BEHIND,
    WAIT_FOR_PREFIX,
    DECODE_FIRST,
)


class Admission(NamedTuple):
    uid: int
    admitted: bool
    reason: str | None  # None when admitted
    extend_len: int  # tokens of its prompt computed by this batch (0 when refused)
    cached_len: int  # prompt tokens already in the KV pool before this batch


class Admissions:
    """A step's admission decisions, in queue order: those made one by one (`decided`), then
    the requests refused as a group (`behind`, all for `behind_reason`): those queued behind the
    first that did not fit, or with policy="decode_first" every one that waits for the decodes.

    The group is kept as a slice of the queue and turned into decisions only when something
    reads them (a `reject` hook, a record): a queue of thousands then costs a step a list copy,
    not an object per waiting request.
    """

    __slots__ = ("decided", "behind", "behind_reason")

    def __init__(
        self,
        decided: list[Admission] | None = None,
        behind: Sequence[Any] = (),  # waiting requests (anything with a uid)
        behind_reason: str = QUEUED_BEHIND,
    ) -> None:
        self.decided = decided if decided is not None else []
        self.behind = behind
        self.behind_reason = behind_reason

    def __iter__(self) -> Iterator[Admission]:
        yield from self.decided
        for pending in self.behind:
            yield Admission(pending.uid, False, self.behind_reason, 0, 0)

    def __len__(self) -> int:
        return len(self.decided) + len(self.behind)

    def __repr__(self) -> str:
        return f"Admissions({self.decided!r}, {len(self.behind)} x {self.behind_reason})"
