"""Sampling parameters of one request; they check themselves on construction."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

GREEDY_BELOW = 1e-5  # temperatures under this sample greedily (vLLM's threshold too)
MIN_REPETITION_PENALTY = 1e-6  # smaller penalties act as this one (below it the logits overflow)
MAX_LOGPROBS = 20  # most likely tokens reported per position at most (OpenAI's top_logprobs limit)
MAX_LOGIT_BIAS = 100.0  # a bias is in [-100, 100] (OpenAI's range: -100 bans a token, 100 all but forces it)
MAX_LOGIT_BIAS_ENTRIES = 1024  # tokens one request may bias (OpenAI takes 300)


@dataclass(slots=True)
class SamplingParams:
    """How to sample a request's completion(s).

    ``temperature`` below ``GREEDY_BELOW`` means greedy (so tiny values, whose logits / temperature
    would overflow, sample as the limit they tend to). ``seed`` makes sampling reproducible per request whatever
    its batch mates. ``n > 1`` forks the request after its prompt's prefill; children share the
    prompt's KV blocks. ``stop`` strings are never emitted in the text (one that completes before
    ``min_tokens`` tokens does not stop the choice, and stays in it); a ``stop_token_ids`` token's
    text is, unless it is a special token (vLLM's rule).

    Penalties: ``repetition_penalty`` (vLLM/HF style, > 0, 1 = off; below ``MIN_REPETITION_PENALTY``
    it acts as that) divides positive logits and
    multiplies negative ones of every token already seen in the prompt or the output.
    ``presence_penalty`` and ``frequency_penalty`` (OpenAI style, in [-2, 2], 0 = off) subtract
    ``frequency_penalty * count + presence_penalty * (count > 0)`` from each token's logit, where
    ``count`` is how often the token occurs in this choice's generated output (never the prompt).

    ``logprobs`` (None: off; 0 to ``MAX_LOGPROBS``): each generated token comes with its log
    probability and the ``logprobs`` most likely tokens' at that position, from the model's own
    distribution (the logits before penalties, temperature, top-k and top-p; vLLM's default too).
    A choice that ends on EOS (or another special token) has no entry for it: its text has none.

    ``prompt_logprobs`` (None: off; 0 to ``MAX_LOGPROBS``): the same for each token of the prompt
    (vLLM's field; what OpenAI's ``echo`` with ``logprobs`` shows): the first has none (nothing
    comes before it), each other its log probability after the tokens before it and that many most
    likely tokens there. Such a prompt is computed whole (the prefix cache would skip the logits of
    the positions it holds).

    ``max_tokens`` 0: the prompt is computed (scored with ``prompt_logprobs``; its blocks cached)
    and nothing is generated (finish reason "length"); such a prompt may fill the whole context.

    ``logit_bias`` (None: off): token id -> a value in [-100, 100] added to that token's logit before
    the penalties and sampling (vLLM's order), as OpenAI defines it; -100 in effect bans the token,
    100 in effect forces it. Logprobs stay the model's own (before the bias). An empty mapping is None.

    ``json_object`` (OpenAI's ``response_format: {"type": "json_object"}``): each choice is decoded
    as one JSON object (``engine.json_grammar``) and ends, finish reason "stop", once it closes
    (``min_tokens``, ``ignore_eos`` and the stop tokens do not hold it open: the object is the
    answer); cut by ``max_tokens`` it is a prefix of one ("length"). Logprobs stay the model's own.

    ``json_schema`` (a JSON Schema as JSON text; OpenAI's ``response_format`` of type
    ``json_schema``): as ``json_object``, the object being one the schema describes
    (``engine.json_schema``: what a schema may use; a schema it cannot honour is a ValueError).

    ``json_optional`` (with either): the grammar holds only an answer whose first token, past
    whitespace, begins with ``{``; any other first token makes the answer free text, as without
    the grammar (the model's choice between a tool call and a text answer: ``tool_choice: "auto"``).
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    seed: int | None = None
    max_tokens: int = 256
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    logit_bias: dict[int, float] | None = None
    json_object: bool = False
    json_schema: str | None = None
    json_optional: bool = False
    # json_schema's compiled grammar (engine.json_schema), held for the request's life: not a
    # parameter (not on the wire, not compared); set by the checks below
    grammar: object = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        # (found by QA: stop=[1] or stop=b"ab" passed, and crashed the step loop for every request)
        if not isinstance(self.stop, (list, tuple)) or not all(isinstance(s, str) for s in self.stop):
            raise ValueError("stop must be a string or a list of strings")
        self.stop = list(self.stop)
        if not isinstance(self.stop_token_ids, (list, tuple)):
            raise ValueError("stop_token_ids must be a list of integers")
        for name in ("temperature", "top_p", "repetition_penalty", "presence_penalty", "frequency_penalty"):
            if not _is_number(getattr(self, name)):  # (True was a temperature of 1)
                raise ValueError(f"{name} must be a number")
            setattr(self, name, float(getattr(self, name)))
        for name in ("ignore_eos", "json_object", "json_optional"):  # ("no" is truthy: it ignored EOS)
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a boolean")
        if not _is_int(self.n):
            raise ValueError("n must be an integer >= 1")
        self.n = int(self.n)
        for name in ("top_k", "max_tokens", "min_tokens"):  # (found by QA: seed=1.5 crashed the step loop,
            if not _is_int(getattr(self, name)):           # for every request, where it reached the sampler)
                raise ValueError(f"{name} must be an integer")
            setattr(self, name, int(getattr(self, name)))  # (a NumPy integer is one: as Python's from here)
        if self.seed is not None:
            if not _is_int(self.seed):
                raise ValueError("seed must be an integer")
            self.seed = int(self.seed)
        if not all(_is_int(t) for t in self.stop_token_ids):
            raise ValueError("stop_token_ids must be integers")
        self.stop_token_ids = [int(t) for t in self.stop_token_ids]
        if self.top_k == -1:
            self.top_k = 0
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError("n must be an integer >= 1")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):  # (NaN compares false)
            raise ValueError("temperature must be a finite number >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0 (or -1 to disable)")
        if self.max_tokens < 0:
            raise ValueError("max_tokens must be >= 0")
        if self.min_tokens < 0 or self.min_tokens > self.max_tokens:
            raise ValueError("min_tokens must be between 0 and max_tokens")
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            raise ValueError("repetition_penalty must be a finite number > 0")
        if self.seed is not None and not -(2**63) <= self.seed <= 2**64 - 1:
            raise ValueError("seed must be a 64-bit integer (from -2**63 to 2**64 - 1)")
        if not -2.0 <= self.presence_penalty <= 2.0:
            raise ValueError("presence_penalty must be in [-2, 2]")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            raise ValueError("frequency_penalty must be in [-2, 2]")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or not 0 <= value <= MAX_LOGPROBS):
                raise ValueError(f"{name} must be between 0 and {MAX_LOGPROBS}")
            if value is not None:
                setattr(self, name, int(value))  # (a NumPy integer is one: found by a re-check)
        if self.logit_bias is not None:
            self.logit_bias = _checked_bias(self.logit_bias)
        if self.json_optional and not (self.json_object or self.json_schema is not None):
            raise ValueError("json_optional needs json_object or json_schema")
        if self.json_schema is not None:
            from engine.json_schema import SchemaError, compile_schema

            if not isinstance(self.json_schema, str):
                raise ValueError("json_schema must be a JSON Schema as JSON text")
            try:
                self.grammar = compile_schema(self.json_schema)
            except SchemaError as err:
                raise ValueError(f"json_schema: {err}") from err

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _checked_bias(bias: object) -> dict[int, float] | None:
    """``logit_bias`` as {token id: float}, None when empty; raises ValueError for anything else."""
    if not isinstance(bias, dict):
        raise ValueError("logit_bias must be a mapping of token ids to numbers")
    if len(bias) > MAX_LOGIT_BIAS_ENTRIES:
        raise ValueError(f"logit_bias may bias at most {MAX_LOGIT_BIAS_ENTRIES} tokens")
    out: dict[int, float] = {}
    for token, value in bias.items():
        if not isinstance(token, int) or isinstance(token, bool) or token < 0:
            raise ValueError("logit_bias keys must be token ids (integers >= 0)")
        if (not isinstance(value, (int, float)) or isinstance(value, bool)
                or not -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS):
            raise ValueError(f"logit_bias values must be numbers in [{-MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}]")
        out[token] = float(value)
    return out or None
