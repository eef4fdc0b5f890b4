"""Token embedding and LM head (which may share its weight), vocabulary-parallel: each rank holds
a contiguous slice of the vocabulary, padded to a multiple of the group size with zero rows."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..distributed import SINGLE, TPGroup
from .parallel import Unfilled


def vocab_rows(vocab_size: int, tp: TPGroup) -> int:
    """Rows of the vocabulary each rank holds (the padded vocabulary over the ranks)."""
    return -(-vocab_size // tp.size)


@torch.no_grad()
def load_vocab_shard(dst: torch.Tensor, full: torch.Tensor, tp: TPGroup) -> None:
    """Copy this rank's rows of a full [vocab, hidden] weight; rows past the vocabulary: zero."""
    start = tp.rank * dst.shape[0]
    n = max(0, min(full.shape[0] - start, dst.shape[0]))
    dst[:n].copy_(full[start : start + n])
    dst[n:].zero_()


class VocabParallelEmbedding(Unfilled, nn.Embedding):
    """Each rank looks up the ids in its slice, zeros for the others; an all-reduce sums them."""

    def __init__(self, vocab_size: int, hidden_size: int, tp: TPGroup = SINGLE) -> None:
        super().__init__(vocab_rows(vocab_size, tp), hidden_size)
        self.vocab_size, self.tp = vocab_size, tp
        self.vocab_start = tp.rank * self.num_embeddings

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return super().forward(ids)
        local = ids - self.vocab_start
        inside = (local >= 0) & (local < self.num_embeddings)
        x = F.embedding(torch.where(inside, local, 0), self.weight)
        return self.tp.all_reduce(x.masked_fill_(~inside[..., None], 0.0))

    def load_shard(self, attr: str, full: torch.Tensor, part: int | None = None) -> None:
        load_vocab_shard(self.weight, full, self.tp)


class LMHead(nn.Module):
    """Logits of this rank's vocabulary slice, gathered so every rank has the full row."""

    def __init__(
        self,
        vocab_size: int,
        hidden_size: int,
        tied_to: VocabParallelEmbedding | None,
        tp: TPGroup = SINGLE,
    ) -> None:
        super().__init__()
        self.tied = tied_to is not None
        self.vocab_size, self.tp = vocab_size, tp
        if tied_to is None:
            self.weight = nn.Parameter(torch.empty(vocab_rows(vocab_size, tp), hidden_size))
        else:
            self.weight = tied_to.weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = F.linear(hidden, self.weight)
        if self.tp.size == 1:
            return logits
        logits = self.tp.all_gather(logits, dim=-1)
        if logits.shape[-1] == self.vocab_size:
            return logits
        # NOTE: contiguous, so the samplers see rows of exactly vocab_size (padding cut off)
        return logits[..., : self.vocab_size].contiguous()

    def load_shard(self, attr: str, full: torch.Tensor, part: int | None = None) -> None:
        load_vocab_shard(self.weight, full, self.tp)
