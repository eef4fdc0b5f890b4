"""One HTTP request's output: the engine's tokens (`push`, `end`) turned into text for the
response (`take`), cut at a stop string. Text that could still start a stop string is held back."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from .protocol import Parsed


class Delta(NamedTuple):
    text: str
    token_ids: list[int]
    finish_reason: str | None  # None: more to come
    # with log probabilities asked: one `Req.logprobs` entry per token of `token_ids`, and
    # the characters of the token texts before them (completions' `text_offset`)
    logprobs: list | None = None
    offset: int = 0
    # with echo, the first delta of a choice: (the prompt's ids, their log probability entries,
    # None first; None when not asked), given before `token_ids` in its `logprobs`
    prompt: tuple[list[int], list | None] | None = None


class Output:
    """One request's output, filled on the event loop from the engine's messages."""

    def __init__(
        self,
        parsed: Parsed,
        arrived: float,
        tokenizer,
        vocab: int,
        interval: int = 1,
        prompt: list[int] | None = None,
        echo: str | None = None,
    ) -> None:
        """`prompt` and `echo`: its prompt's (None: the request's first, `parsed.token_ids`)."""
        self.parsed = parsed
        self.prompt_ids = parsed.token_ids if prompt is None else prompt
        self.echo = parsed.echo if prompt is None else echo
        self.echo_only = parsed.echo_only  # the prompt alone: the engine's one token left out
        self.interval = interval  # tokens that wake the response (`stream_interval`)
        self.arrived = arrived  # time.perf_counter()
        self.created = int(time.time())
        self.id = ""  # set by the service: the response's, the same for each of its choices
        self.index = 0  # which of the response's choices (`n`)
        self.rid = -1  # set by the service; the engine's messages name it
        self.cancelled = False  # the client left, or a stop string ended it: abort it
        self.stopped = False  # a stop string ended it before the engine did
        self.answered = -1  # with a stop string reached: the tokens up to it (-1: not reached)
        self.cached_tokens = 0  # prompt tokens its admission found in the prefix cache
        self.admitted = False
        self.tokens: list[int] = []
        self._taken = 0
        # beside `tokens`, when the request asked for them (`SamplingParams.logprobs`)
        self.logprobs: list | None = None if parsed.sampling.logprobs is None else []
        # with echo and logprobs: the prompt's (None first), as its first token comes
        self.prompt_logprobs: list | None = None
        self._sent_logprobs: list = []
        self._text = ""  # text not sent yet (held back for a stop string)
        self._sent_ids: list[int] = []
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.usage: dict | None = None
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self._wake = asyncio.Event()
        self._decoder = Decoder(tokenizer, vocab)
        self._offset = 0  # characters of the token texts taken (`Delta.offset`)
        self._stop_hold = max((len(s) for s in parsed.stop), default=1) - 1
        self._echoed = self.echo is None  # the prompt sent (or nothing to echo)
        if not self._echoed and self.logprobs is not None:  # the completion's offsets follow it
            self._offset = sum(len(self.token_text(t)) for t in self.prompt_ids)

    def token_text(self, token: int) -> str:
        """One token's text, as a log probability names it ("" past the tokenizer's vocabulary)."""
        return self._decoder.token_text(token)

    def token_bytes(self, token: int) -> bytes:
        """One token's own bytes (`Decoder.token_bytes`), as a log probability's `bytes`."""
        return self._decoder.token_bytes(token)

    def push(self, tokens: list[int], at: float, logprobs: list | None = None) -> None:
        if self.echo_only:
            tokens, logprobs = [], None
        self.tokens.extend(tokens)
        if self.logprobs is not None and logprobs is not None:
            self.logprobs.extend(logprobs)
        self.first_token_at = self.first_token_at if self.first_token_at is not None else at
        self.last_token_at = at
        if self.unsent >= self.interval:
            self._wake.set()

    def end(self, reason: str, usage: dict, error: str | None = None) -> None:
        if self.echo_only and reason in ("stop", "length"):  # asked for no tokens, given none
            reason, usage = "length", {**usage, "completion_tokens": 0}
        if self.finish_reason is None:
            self.finish_reason, self.usage, self.error = reason, usage, error
        self._wake.set()

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def unsent(self) -> int:
        return len(self.tokens) - self._taken

    async def wait(self) -> None:
        await self._wake.wait()
        self._wake.clear()

    def take(self) -> Delta:
        """The text and tokens new since the last call, ending before a stop string; with echo,
        the first begins with the prompt."""
        delta = self._take()
        if self._echoed:
            return delta
        self._echoed = True
        prompt = self.prompt_ids, None
        if self.logprobs is not None:
            prompt = self.prompt_ids, self.echo_logprobs()
        return delta._replace(text=self.echo + delta.text, prompt=prompt)

    def echo_logprobs(self) -> list:
        """The prompt's log probability entries, None first (as many Nones where none came)."""
        return self.prompt_logprobs or [None] * len(self.prompt_ids)

    def _take(self) -> Delta:
        taken, self._taken = self._taken, len(self.tokens)
        new = self.tokens[taken:]
        logprobs = None if self.logprobs is None else self.logprobs[taken : self._taken]
        if not self.parsed.stop:
            text = self._decoder.add(new)
            return Delta(text, new, self.finish_reason, *self._offsets(logprobs, new))
        finish = self.finish_reason
        # NOTE: token by token: the tokens after the one whose text reached a stop string (the
        # engine may have run on while this waited) are not the answer's
        for i, token in enumerate(new):
            self._sent_ids.append(token)
            if logprobs is not None:
                self._sent_logprobs.append(logprobs[i])
            self._text += self._decoder.add([token])
            cut = _first_stop(self._text, self.parsed.stop)
            if cut is not None:
                self._text, finish = self._text[:cut], "stop"
                if self.finish_reason is None:
                    self.finish_reason, self.stopped = "stop", True
                self.answered = taken + i + 1
                break
        held = 0 if finish is not None else min(self._stop_hold, len(self._text))
        text = self._text[: len(self._text) - held]
        self._text = self._text[len(text) :]
        ids, self._sent_ids = self._sent_ids, []
        if logprobs is not None:
            logprobs, self._sent_logprobs = self._sent_logprobs, []
        return Delta(text, ids, finish, *self._offsets(logprobs, ids))

    def _offsets(self, logprobs: list | None, ids: list[int]) -> tuple:
        """(`logprobs`, where the texts of their tokens `ids` start), the offset moved past."""
        if logprobs is None:
            return None, 0
        start = self._offset
        self._offset += sum(len(self.token_text(token)) for token in ids)
        return logprobs, start


def _first_stop(text: str, stops: tuple[str, ...]) -> int | None:
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found) if found else None


class Decoder:
    """Token ids to text, incrementally: a fast tokenizer's `DecodeStream`, else all again."""

    def __init__(self, tokenizer, vocab: int) -> None:
        self.known = min(vocab, len(tokenizer))  # a dummy model's ids beyond the tokenizer's
        self.tokenizer = tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self.stream = self.backend = None
        if backend is not None:
            from tokenizers.decoders import DecodeStream

            self.backend, self.stream = backend, DecodeStream(skip_special_tokens=True)
        self.ids: list[int] = []
        self.sent = ""
        self._texts: dict[int, str] = {}
        self._bytes: dict[int, bytes] = {}
        self.byte_level = backend is not None and '"ByteLevel"' in backend.to_str()

    def token_bytes(self, token: int) -> bytes:
        """One token's own bytes, which its text loses where the token holds part of a
        character (its text is then U+FFFD): a byte-level token's characters are bytes, a
        byte-fallback token ("<0xF0>") is one, a SentencePiece token's "\u2581" a space."""
        raw = self._bytes.get(token)
        if raw is None:
            piece = self.tokenizer.convert_ids_to_tokens(token) if token < self.known else ""
            if token in self.tokenizer.all_special_ids:
                raw = self.token_text(token).encode()
            elif self.byte_level:
                raw = bytes(_BYTE_OF.get(c, 0) for c in piece)
            elif len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
                raw = bytes([int(piece[3:5], 16)])
            else:
                raw = piece.replace("\u2581", " ").encode()
            self._bytes[token] = raw
        return raw

    def token_text(self, token: int) -> str:
        text = self._texts.get(token)
        if text is None:
            known = token < self.known
            text = self.tokenizer.decode([token], skip_special_tokens=False) if known else ""
            self._texts[token] = text
        return text

    def add(self, tokens: list[int]) -> str:
        tokens = [t for t in tokens if t < self.known]
        if self.stream is not None:
            return "".join(piece for t in tokens if (piece := self.stream.step(self.backend, t)))
        self.ids.extend(tokens)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):  # a character cut between tokens: wait for the rest
            return ""
        new, self.sent = text[len(self.sent) :], text
        return new


def _byte_alphabet() -> dict[str, int]:
    """Byte-level BPE's characters: each byte a printable character (GPT-2's alphabet: the
    printable Latin-1 bytes stand for themselves, the others for 256 + n in order)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    others = [b for b in range(256) if b not in printable]
    alphabet = {chr(b): b for b in printable}
    alphabet.update({chr(256 + n): b for n, b in enumerate(others)})
    return alphabet


_BYTE_OF = _byte_alphabet()
