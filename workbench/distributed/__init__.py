"""Tensor parallelism: the group a process belongs to and its collectives (torch.distributed)."""

from .group import SINGLE, TPGroup, close_tp, init_tp

__all__ = ["SINGLE", "TPGroup", "close_tp", "init_tp"]
