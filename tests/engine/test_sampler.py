import math

import torch

from engine.request import Request, RequestId
from engine.sampler import Sampler
from engine.sampling_params import SamplingParams


def seq(rid="r", prompt=(1, 2, 3), **params):
    return Request(RequestId(rid), list(prompt), SamplingParams(**params)).sequences[0]


def logits_from_probs(probs):
    return torch.tensor([[math.log(p) for p in probs]], dtype=torch.float32)


def test_greedy_is_argmax():
    logits = torch.randn(5, 50)
    seqs = [seq(f"r{i}", temperature=0.0) for i in range(5)]
    assert Sampler().sample(logits, seqs) == logits.argmax(-1).tolist()


def test_seed_reproducible_regardless_of_batch_mates():
    torch.manual_seed(0)
    row = torch.randn(1, 100)
    mates = torch.randn(4, 100)

    def draws(batch_builder):
        s = seq("x", temperature=0.9, top_p=0.95, top_k=40, seed=1234)
        sampler = Sampler(seed=99)
        out = []
        for step in range(20):
            others = [seq(f"m{step}-{i}", temperature=1.0) for i in range(4)]
            logits, seqs, pos = batch_builder(s, others)
            out.append(sampler.sample(logits, seqs)[pos])
        return out

    alone = draws(lambda s, others: (row, [s], 0))
    middle = draws(lambda s, others: (torch.cat([mates[:2], row, mates[2:]]), others[:2] + [s] + others[2:], 2))
    greedy_mates = draws(lambda s, others: (
        torch.cat([row, mates]), [s] + [seq(f"g{i}", temperature=0.0) for i in range(4)], 0))
    assert alone == middle == greedy_mates
    other_seed = []
    s2 = seq("y", temperature=0.9, top_p=0.95, top_k=40, seed=4321)
    sampler = Sampler()
    for _ in range(20):
        other_seed.append(sampler.sample(row, [s2])[0])
    assert other_seed != alone


def test_top_k_support_set():
    probs = [0.3, 0.25, 0.2, 0.15, 0.1]
    s = seq(temperature=1.0, top_k=3, seed=0)
    sampler = Sampler()
    seen = {sampler.sample(logits_from_probs(probs), [s])[0] for _ in range(300)}
    assert seen == {0, 1, 2}


def test_top_p_support_set():
    probs = [0.5, 0.3, 0.15, 0.05]
    sampler = Sampler()
    s = seq("a", temperature=1.0, top_p=0.8, seed=0)
    assert {sampler.sample(logits_from_probs(probs), [s])[0] for _ in range(300)} == {0, 1}
    s = seq("b", temperature=1.0, top_p=0.85, seed=0)
    assert {sampler.sample(logits_from_probs(probs), [s])[0] for _ in range(300)} == {0, 1, 2}
    s = seq("c", temperature=1.0, seed=0)
    assert {sampler.sample(logits_from_probs(probs), [s])[0] for _ in range(600)} == {0, 1, 2, 3}


def test_low_temperature_concentrates():
    probs = [0.4, 0.35, 0.25]
    s = seq(temperature=0.02, seed=1)  # p(token 0) ~ 0.999
    sampler = Sampler()
    draws = [sampler.sample(logits_from_probs(probs), [s])[0] for _ in range(100)]
    assert draws.count(0) >= 95


def test_repetition_penalty_discourages_seen_tokens():
    logits = torch.tensor([[2.0, 1.9, 0.0, -1.0]])
    s = seq(prompt=[0], temperature=0.0, repetition_penalty=2.0)
    assert Sampler().sample(logits, [s]) == [1]
    assert logits[0, 0] == 2.0  # the caller's tensor is untouched


def test_min_tokens_blocks_eos_and_stop_ids():
    logits = torch.tensor([[5.0, 4.0, 3.0, 0.0]])
    sampler = Sampler(eos_token_ids=[0])
    s = seq(temperature=0.0, min_tokens=2, stop_token_ids=[1])
    assert sampler.sample(logits, [s]) == [2]
    s.token_ids += [2, 2]  # min_tokens reached
    assert sampler.sample(logits, [s]) == [0]
