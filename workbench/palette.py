"""Every colour of the views. A leaf module, so step records' HTML shares them with the charts."""

KIND_COLORS = {"chunk": "#f4a261", "prefill": "#2a9d8f", "decode": "#457b9d", "padding": "#cccccc"}
KV_COLORS = {"in use": "#e76f51", "evictable": "#e9c46a", "free": "#a8dadc"}
FAMILY_COLORS = {
    "attention": "#264653",
    "matmul": "#2a9d8f",
    "sampling": "#e9c46a",
    "norm/rope/act": "#f4a261",
    "communication": "#8338ec",
    "experts": "#9b2226",  # a mixture of experts' fused expert kernels
    "router": "#bb3e03",  # their routing and sort into blocks, in one launch at small batches
    "other": "#b0b0b0",
    "between kernels": "#d9d9d9",  # the device's time outside the kernels it ran
    "idle": "#f2f2f2",
}
NOT_PROFILED_COLOR = "#ffffff"  # a step the profiler did not record: outlined, not filled
HOOK_COLORS = {
    "schedule.end": "#ff8fab",
    "batch.prepared": "#c9184a",
    "forward.end": "#9c6644",
    "sample.end": "#ffc8dd",
    "step.end": "#590d22",
}
STAGE_COLORS = {
    "schedule": "#6d597a",
    "prepare": "#b56576",
    "plan": "#e56b6f",
    "forward": "#355070",
    "sample": "#eaac8b",
    "share": "#a3b18a",
    "collect": "#588157",
    "record": "#9a8c98",
}
DEVICE_COLOR = "#111111"
# every reason in `core.admission.REASONS`, so a colour means the same in every run
DECISION_COLORS = {
    "admitted": "#2a9d8f",
    "no_token_budget": "#e76f51",
    "no_slot": "#8338ec",
    "kv_full": "#d62828",
    "kv_full_after_lock": "#9d0208",
    "queued_behind": "#bdbdbd",
    "wait_for_prefix": "#e9c46a",
    "decode_first": "#457b9d",
}
LEDGER_PART_COLORS = {"cached": "#8d99ae", "extend": "#e63946", "remain": "#edf2f4"}
PAGE_OWNER_COLORS = {"own": "#457b9d", "shared": "#e76f51", "prefix cache": "#e9c46a"}
MISS_COLORS = {
    **{f"queued: {r}": c for r, c in DECISION_COLORS.items() if r != "admitted"},
    "queued: arrived mid-step": "#dddddd",
    "prompt in chunks": KIND_COLORS["chunk"],
    "prefill": KIND_COLORS["prefill"],
    "decode": KIND_COLORS["decode"],
    "decode slowed by prefill": "#f72585",
    "decode paused for prefill": "#6c757d",
}
