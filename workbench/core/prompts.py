"""A prompt as token ids: text through the tokenizer, or ids checked against the vocabulary."""

from __future__ import annotations

from typing import Any

from .. import validate as V


def encode_prompt(tokenizer, vocab_size: int, prompt: Any, name: str = "prompt") -> list[int]:
    if isinstance(prompt, str):
        ids = tokenizer(V.text(name, prompt)).input_ids
        if ids and max(ids) >= vocab_size:  # a tokenizer of more tokens than the model has
            bad = [t for t in ids if t >= vocab_size]
            raise ValueError(
                f"{name}'s text encodes to token ids outside the model's vocabulary "
                f"[0, {vocab_size}): {bad[:5]} (its tokenizer has {len(tokenizer)} tokens)"
            )
        return ids
    return V.token_ids(name, prompt, vocab_size)
