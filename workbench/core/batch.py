"""One forward's requests: Batch, with its ledger as launched."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from .request import ChunkedReq, Req, ReqView

Phase = Literal["prefill", "decode", "mixed"]
_ONE_MORE = np.array([[0], [1], [1]])  # a decode row's ledger one step on (rows, cached, device)


@dataclass
class Batch:
    """The requests of one forward. A "mixed" batch runs its first `num_decode` requests' next
    tokens with prefill chunks of the others, through the prefill path."""

    reqs: list[Req]
    phase: Phase
    num_decode: int = -1  # requests at the head that decode; -1: all for "decode", none otherwise
    # filled by `snapshot` (`CacheManager.allocate`): [3, size] table_idx, cached_len, device_len
    ledger: np.ndarray = field(init=False)
    max_lens: np.ndarray = field(init=False)
    # filled with the batch's inputs (engine/inputs.py; a CUDA graph keeps its own)
    input_ids: torch.Tensor = field(init=False)
    positions: torch.Tensor = field(init=False)
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
        return self.reqs[self.num_decode :]

    @property
    def num_tokens(self) -> int:
        return sum(r.extend_len for r in self.reqs)

    def views(self) -> list[ReqView]:
        return [ReqView.of(r, i < self.num_decode) for i, r in enumerate(self.reqs)]

    def snapshot(self, after: Batch | None = None) -> None:
        """Keep the requests' lengths as launched (from `after`'s when both decode the same)."""
        if (
            after is not None
            and self.phase == "decode" == after.phase
            and after.reqs == self.reqs  # the same objects, in order (eq=False: identity)
        ):
            # NOTE: each row computed one token: what it knew is cached, and one more is known
            self.ledger = after.ledger + _ONE_MORE
            self.max_lens = after.max_lens
            return
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
        """The `ReqView` fields as launched, one tuple per field (`like`'s where unchanged)."""
        if self._columns is None:
            rows, cached, device = self.ledger.tolist()
            same = (
                like is not None
                and like._columns is not None
                and like.phase == self.phase
                and like.num_decode == self.num_decode
                and like.reqs == self.reqs
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
