"""How a request picks its tokens: SamplingParams, checked when made."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from .. import validate as V

MIN_TEMPERATURE = 1e-5  # logits / temperature must stay finite in float32
FLOAT32_MAX = float(np.finfo(np.float32).max)
MAX_LOGPROBS = 20  # most likely tokens a position reports at most (OpenAI's top_logprobs bound)
MAX_LOGIT_BIAS = 100.0  # OpenAI's bound of a logit_bias value
MAX_PENALTY = 2.0  # OpenAI's bound of presence_penalty and frequency_penalty (either sign)
MAX_REPETITION_PENALTY = 100.0
# what vLLM's and Hugging Face's users write that SamplingParams takes otherwise, or not at all
OTHER_NAMES = {
    "max_new_tokens": "it is max_tokens here",
    "do_sample": "temperature > 0 samples here (0, the default, is greedy)",
    "top_logprobs": "it is logprobs=N here",
    "n": "for n samples give the prompt n times, each with its own seed",
    "stop": "stop strings are the server's (a request's 'stop'); here a request ends at its EOS "
    "or max_tokens",
    "stop_token_ids": "here a request ends at its EOS or max_tokens (ignore_eos=True: max_tokens)",
    "min_tokens": "here a request ends at its EOS or max_tokens (ignore_eos=True: max_tokens)",
}


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens for one request (`temperature=0`, the default: greedy); checked."""

    def __new__(cls, *args, **kwargs):
        for name in kwargs:
            if name not in cls.__dataclass_fields__ or name == "adjusts_logits":
                taken = [f for f in cls.__dataclass_fields__ if f != "adjusts_logits"]
                raise V.unknown_keyword("SamplingParams", name, taken, OTHER_NAMES)
        return super().__new__(cls)

    max_tokens: int = 16
    temperature: float = 0.0
    top_k: int = -1  # -1: no top-k
    top_p: float = 1.0
    ignore_eos: bool = False
    seed: int | None = None  # same seed, same tokens, whatever else is in the batch
    # each output token's log probability under the model (its logits' log-softmax, before
    # temperature, top-k and top-p), with the `logprobs` most likely tokens there; None: none
    logprobs: int | None = None
    # each prompt token's log probability given the tokens before it (the first has none), with
    # the `prompt_logprobs` most likely tokens there; None: none. Every prompt position is
    # computed: the request takes nothing from the prefix cache
    prompt_logprobs: int | None = None
    # token id -> a number in [-100, 100] added to that token's logit before it is picked (as
    # OpenAI's `logit_bias`: -100 all but bans it, 100 all but forces it, unless logits differ
    # by more); log probabilities stay the model's own. None: no bias. (Left out of the hash: a
    # dict has none, and params that compare equal still hash alike.)
    logit_bias: Mapping[int, float] | None = field(default=None, hash=False)
    # OpenAI's penalties on the tokens generated so far, subtracted from their logits before a
    # token is picked: `presence_penalty` once for each token that has appeared,
    # `frequency_penalty` once for each time it has (both in [-2, 2]); and Hugging Face's
    # `repetition_penalty` on every token of the prompt and the output, a logit divided by it
    # where positive and multiplied where not (1: none)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        # NOTE: logits are divided by it in float32: a larger one would be inf there
        temperature = V.real(
            "temperature",
            self.temperature,
            low=0.0,
            high=FLOAT32_MAX,
            allowed=f"0 (greedy) or from {MIN_TEMPERATURE} to {FLOAT32_MAX:.4g} (the largest "
            "float32)",
        )
        if 0.0 < temperature < MIN_TEMPERATURE:
            raise ValueError(
                f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE} (smaller ones "
                f"overflow the logits), got {self.temperature!r}"
            )
        top_k = V.integer("top_k", self.top_k)
        if top_k == 0 or not -1 <= top_k < 2**31:
            raise ValueError(
                f"top_k must be -1 (off) or an integer from 1 to {2**31 - 1}, got {top_k}"
            )
        checked = dict(
            max_tokens=V.integer("max_tokens", self.max_tokens, 1),
            temperature=temperature,
            top_k=top_k,
            top_p=V.real("top_p", self.top_p, 0.0, 1.0, low_open=True),
            ignore_eos=V.boolean("ignore_eos", self.ignore_eos),
            seed=V.optional_integer("seed", self.seed, 0, 2**63 - 1),
            logprobs=V.optional_integer("logprobs", self.logprobs, 0, MAX_LOGPROBS),
            prompt_logprobs=V.optional_integer(
                "prompt_logprobs", self.prompt_logprobs, 0, MAX_LOGPROBS
            ),
            logit_bias=_logit_bias(self.logit_bias),
            presence_penalty=V.real(
                "presence_penalty", self.presence_penalty, -MAX_PENALTY, MAX_PENALTY
            ),
            frequency_penalty=V.real(
                "frequency_penalty", self.frequency_penalty, -MAX_PENALTY, MAX_PENALTY
            ),
            repetition_penalty=V.real(
                "repetition_penalty",
                self.repetition_penalty,
                0.0,
                MAX_REPETITION_PENALTY,
                low_open=True,
            ),
        )
        for name, value in checked.items():  # plain Python values (numpy ints become ints)
            object.__setattr__(self, name, value)
        # NOTE: read for every request of a batch the sampler has not seen: a plain attribute
        object.__setattr__(self, "adjusts_logits", self.logit_bias is not None or self.penalized)

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    adjusts_logits: bool = field(init=False, repr=False, compare=False)  # a bias or a penalty

    @property
    def penalized(self) -> bool:
        """Whether a penalty depends on the tokens so far."""
        return bool(self.presence_penalty or self.frequency_penalty) or (
            self.repetition_penalty != 1.0
        )


def _logit_bias(value) -> dict[int, float] | None:
    """A copy as {token id: bias} (None for none); token ids are checked against a model's
    vocabulary when a request is made (`LLM.check_request`)."""
    if value is None:
        return None
    bias = V.mapping("logit_bias", value)
    checked = {}
    for token, number in bias.items():
        token = V.integer("logit_bias's token ids", token, 0)
        checked[token] = V.real(f"logit_bias[{token}]", number, -MAX_LOGIT_BIAS, MAX_LOGIT_BIAS)
    return checked or None


def sampling_batch(
    sampling: SamplingParams | list | tuple | None, count: int
) -> list[SamplingParams]:
    """One SamplingParams per prompt: from one for all (None: the defaults) or a list."""
    if sampling is None or isinstance(sampling, SamplingParams):
        return [sampling or SamplingParams()] * count
    if not isinstance(sampling, list | tuple) or not all(
        isinstance(p, SamplingParams) for p in sampling
    ):
        raise V.WrongType(
            "sampling must be a SamplingParams, a list of them (one per prompt) or None, "
            f"got {sampling!r}"
        )
    if len(sampling) != count:
        raise ValueError(f"{count} prompts but {len(sampling)} sampling params")
    return list(sampling)
