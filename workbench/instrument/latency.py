"""Per-request latency, defined once: the records, the views and the benchmarks all use these.

TPOT (time per output token) is measured after the first token, as vLLM and SGLang report it:
``(finish - first_token) / (output_tokens - 1)``; a request with fewer than two tokens has none.
The arguments may be numbers (seconds, or steps) or pandas Series of them.
"""

from __future__ import annotations


def tpot(first_token, finish, output_tokens):
    """Time per output token after the first: None for a number below two tokens (or a missing
    finish); for Series, NaN where a request has fewer than two tokens."""
    if hasattr(output_tokens, "where"):  # pandas
        return ((finish - first_token) / (output_tokens - 1)).where(output_tokens > 1)
    if finish is None or first_token is None or output_tokens < 2:
        return None
    return (finish - first_token) / (output_tokens - 1)
