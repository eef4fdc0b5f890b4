"""The engine: forward one batch on the device and sample from its logits (`Engine`), with its
CUDA graphs, sampler and tensor-parallel ranks."""

from .engine import DeviceStep, Engine

__all__ = ["DeviceStep", "Engine"]
