"""Request and sequence state.

A ``Request`` is what a client asked for: one prompt, sampling params, ``n`` choices. Each
choice is a ``Sequence``: the unit the scheduler and the KV-cache manager deal with. A request
starts with one sequence; when ``n > 1`` it forks after its prompt's prefill and the children
share the prompt's blocks (copy-on-write).

    token_ids:  [ prompt ............ | output ...... ]
                  <- num_computed_tokens ->|<- still to run through the model ->
"""

from __future__ import annotations

import enum
import itertools
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NewType

from engine.outputs import RequestMetrics
from engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    import torch

    from engine.block_pool import BlockHash
    from engine.detokenizer import IncrementalDetokenizer
    from engine.json_grammar import Grammar

RequestId = NewType("RequestId", str)
SeqId = NewType("SeqId", int)

_seq_counter = itertools.count()


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class Sequence:
    """One choice of a request. ``token_ids`` grows as tokens are sampled."""

    request: Request
    index: int
    token_ids: list[int]
    num_prompt_tokens: int
    seq_id: SeqId = field(default_factory=lambda: SeqId(next(_seq_counter)))
    status: SeqStatus = SeqStatus.WAITING
    num_computed_tokens: int = 0
    block_hashes: list[BlockHash] = field(default_factory=list)
    generator: torch.Generator | None = None
    bias: tuple[torch.Tensor, torch.Tensor] | None = None  # params.logit_bias as (token ids, values), once
    detok: IncrementalDetokenizer | None = None
    json_state: tuple | None = None  # JSON mode: its grammar's state after its output (engine.json_grammar)
    json_grammar: Grammar | None = None  # that grammar: json_grammar.OBJECT or a compiled json_schema
    finish_reason: str | None = None
    num_preemptions: int = 0
    last_token_time: float | None = None
    steps_blocked: int = 0  # steps in a row its admission found no room (scheduler's starvation bound)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def is_finished(self) -> bool:
        return self.status is SeqStatus.FINISHED

    @property
    def params(self) -> SamplingParams:
        return self.request.params


@dataclass(slots=True, eq=False)
class Request:
    """A client request: its prompt, params, tenancy handles (opaque here) and choices."""

    request_id: RequestId
    prompt_token_ids: list[int]
    params: SamplingParams
    salt: str | None = None
    priority_class: str | None = None
    arrival_time: float = field(default_factory=time.monotonic)
    sequences: list[Sequence] = field(default_factory=list)
    metrics: RequestMetrics | None = None
    cached_prompt_tokens: int = 0
    forked: bool = False
    aborted: bool = False
    # ``params.prompt_logprobs``: per prompt position, its token's entry (None for the first),
    # filled as the prefill's chunks run; handed out once, with the request's first output
    prompt_logprobs: list | None = None
    prompt_logprobs_sent: bool = False

    def __post_init__(self) -> None:
        if self.metrics is None:
            self.metrics = RequestMetrics(arrival_time=self.arrival_time)
        if not self.sequences:
            self.sequences.append(
                Sequence(self, 0, list(self.prompt_token_ids), len(self.prompt_token_ids))
            )

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def scores_prompt(self) -> bool:
        """Whether its prompt's logprobs are still to compute (its prefill then skips the prefix
        cache: a cached block's positions would get no logits)."""
        return self.params.prompt_logprobs is not None and not self.prompt_logprobs_sent

    @property
    def is_finished(self) -> bool:
        # before the fork a request with n > 1 has one sequence: not finished yet
        return self.aborted or (
            len(self.sequences) == self.params.n and all(s.is_finished for s in self.sequences)
        )
