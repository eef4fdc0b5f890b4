"""A prompt as token ids: text through the tokenizer, or ids checked against the vocabulary."""

from __future__ import annotations

from typing import Any

from .. import validate as V


def encode_prompt(tokenizer, vocab_size: int, prompt: Any, name: str = "prompt") -> list[int]:
    if isinstance(prompt, str):
        return tokenizer(V.text(name, prompt)).input_ids
    return V.token_ids(name, prompt, vocab_size)
