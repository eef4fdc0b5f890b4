"""One request's progress: Req (admitted), ChunkedReq, PendingReq (waiting), ReqView (launched)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from .sampling import SamplingParams

if TYPE_CHECKING:
    from ..kvcache.base import CacheHandle


def ceil_page(n: int, page_size: int) -> int:
    return -(-n // page_size) * page_size


def check_request(
    token_ids: list[int],
    sampling: SamplingParams,
    index: int,
    max_seq_len: int,
    page_size: int,
    capacity: int,
    vocab_size: int | None = None,
    tp_size: int = 1,
) -> None:
    """Raise TypeError or ValueError if request `index` could never run in this context and pool
    (and, given `vocab_size`, if its `logit_bias` names a token the model does not have)."""
    if not isinstance(sampling, SamplingParams):
        raise TypeError(f"sampling for prompt {index} must be a SamplingParams, got {sampling!r}")
    if not token_ids:
        raise ValueError(f"prompt {index} is empty")
    total = len(token_ids) + sampling.max_tokens
    if total > max_seq_len:
        raise ValueError(
            f"prompt {index} has {len(token_ids)} token{'s' * (len(token_ids) != 1)}; with "
            f"max_tokens={sampling.max_tokens} that is {total}, longer than the context "
            f"of {max_seq_len} tokens"
        )
    unknown = [t for t in sampling.logit_bias or () if vocab_size is not None and t >= vocab_size]
    if unknown:
        raise ValueError(
            f"logit_bias of prompt {index} names token {unknown[0]}, outside this model's "
            f"vocabulary [0, {vocab_size})"
        )
    if sampling.penalized and tp_size > 1:
        # NOTE: the other ranks lack the prompt tokens a step takes from the prefix cache
        raise ValueError(
            f"presence_penalty, frequency_penalty and repetition_penalty (prompt {index}) are "
            f"not supported with tensor parallelism (tp_size {tp_size}); leave them at 0, 0 "
            "and 1"
        )
    need = ceil_page(total, page_size)
    if need > capacity:
        raise ValueError(
            f"prompt {index} needs {need} KV slots (prompt {len(token_ids)} + max_tokens "
            f"{sampling.max_tokens}), more than the KV pool can ever hold ({capacity}); "
            "raise num_pages or lower max_tokens"
        )


def floor_page(n: int, page_size: int) -> int:
    return n // page_size * page_size


def kv_tokens_needed(total_len: int, cached_len: int, page_size: int) -> int:
    """KV slots a request of `total_len` tokens may still allocate after `cached_len` of them."""
    return ceil_page(total_len, page_size) - ceil_page(cached_len, page_size)


@dataclass(eq=False)
class Req:
    """One admitted request: a page-table row, a prefix-cache handle and three lengths,
    ``0 <= cached_len < device_len <= max_device_len``: KV in the pool, tokens the device knows
    (computed, or by the batch in flight), prompt + max_tokens."""

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
    error: str | None = field(default=None, init=False)
    # with sampling.logprobs set, one per output token: (its log probability, the most likely
    # tokens there as (token id, log probability), most likely first)
    logprobs: list[tuple[float, list[tuple[int, float]]]] | None = field(default=None, init=False)
    # with sampling.prompt_logprobs set: the whole prompt (a chunk's `token_ids` stop at its
    # end, and its last position's log probability is of the token after it), and one entry as
    # above per prompt token after the first, filled as its chunks run
    prompt_ids: list[int] | None = field(default=None, init=False)
    prompt_logprobs: list[tuple[float, list[tuple[int, float]]]] | None = field(
        default=None, init=False
    )
    # KV slots its row holds (`CacheManager.allocate`): between steps ceil_page(cached_len)
    alloc_len: int = field(init=False)
    released: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        if self.device_len < 0:
            self.device_len = len(self.token_ids)
        if self.max_device_len < 0:
            self.max_device_len = self.prompt_len + self.sampling.max_tokens
        self.alloc_len = self.cached_len  # admission: whole pages matched in the prefix cache
        if self.sampling.logprobs is not None:
            self.logprobs = []
        if self.sampling.prompt_logprobs is not None:
            self.prompt_logprobs = []
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
        """A tensor-parallel rank's copy of rank 0's request: no tokens, no cache handle."""
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

    @staticmethod
    def complete_all(reqs: list[Req]) -> None:
        """`complete_one()` of each request, inlined: a call per request costs host time."""
        for req in reqs:
            req.cached_len = n = req.device_len
            req.device_len = n + 1

    def end_reason(self, token: int, eos_ids: frozenset[int]) -> str | None:
        """Host side, once `token` is appended: "stop", "length" or None."""
        if token in eos_ids and not self.sampling.ignore_eos:
            return "stop"
        # NOTE: not remain_len: with overlap the device is a step ahead, and it would end early
        return "length" if len(self.token_ids) == self.max_device_len else None

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(uid={self.uid}, table_idx={self.table_idx}, "
            f"cached_len={self.cached_len}, device_len={self.device_len}, "
            f"max_device_len={self.max_device_len})"
        )


class ChunkedReq(Req):
    """A request whose prompt is only partly computed; it returns to the head of the queue."""

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


@dataclass(eq=False)
class PendingReq:
    """A waiting request: no slot, no cache handle (unless a chunk of it already ran)."""

    uid: int
    token_ids: list[int]
    sampling: SamplingParams
    chunked: ChunkedReq | None = None  # set while its prompt is being prefilled in chunks

    @property
    def prompt_len(self) -> int:
        return len(self.token_ids)

    @property
    def total_len(self) -> int:
        """Its prompt and every token it may generate: what admission reserves KV for."""
        return len(self.token_ids) + self.sampling.max_tokens
