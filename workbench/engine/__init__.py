"""The engine: forward one batch on the device, and sample from its logits."""
