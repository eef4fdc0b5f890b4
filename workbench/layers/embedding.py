"""Token embedding and the LM head (which may share the embedding's weight)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class LMHead(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int, tied_to: nn.Embedding | None) -> None:
        super().__init__()
        self.tied = tied_to is not None
        if tied_to is None:
            self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size))
        else:
            self.weight = tied_to.weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.weight)
