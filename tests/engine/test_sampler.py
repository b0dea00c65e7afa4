import math
from collections import Counter

import pytest
import torch

from engine.request import Request, RequestId
from engine.sampler import Sampler, choice_seed
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


def test_every_bit_of_a_seed_counts():
    """The CPU generator keeps 32 bits of its seed: seeds apart by 2**32 (or in their sign) drew the
    same tokens before the seed was mixed (found by QA)."""
    def first_draws(seed: int, index: int = 0) -> list[float]:
        g = torch.Generator()
        g.manual_seed(choice_seed(seed, index))
        return torch.rand(8, generator=g).tolist()

    base = first_draws(12345)
    assert first_draws(12345) == base  # deterministic
    for other in (12345 + 2**32, 12345 + 7 * 2**32, 12345 + 2**63, -12345):
        assert first_draws(other) != base, other
    assert first_draws(0) != first_draws(2**40)
    # choices of one request differ, and one seed's choice 1 is not a nearby seed's choice 0
    assert first_draws(12345, 1) != base and first_draws(12345, 1) != first_draws(12346, 0)
    assert len({choice_seed(s, i) & 0xFFFF_FFFF for s in range(200) for i in range(16)}) == 3200
    assert -1 & 0xFFFF_FFFF_FFFF_FFFF == 2**64 - 1 and choice_seed(-1, 0) == choice_seed(2**64 - 1, 0)  # int64/uint64


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


# --------------------------------------------------------------------- presence / frequency penalties


def with_output(s, output):
    s.token_ids += list(output)
    return s


def openai_penalized(row, output, presence, frequency):
    """Reference: OpenAI's formula, one token at a time."""
    out = row.clone()
    for tok, count in Counter(output).items():
        out[tok] -= frequency * count + presence * (count > 0)
    return out


def test_presence_and_frequency_penalties_follow_the_openai_formula():
    torch.manual_seed(0)
    logits = torch.randn(1, 12)
    # token 1 is in the prompt only: never penalized by these two
    s = with_output(seq(prompt=[1, 2], temperature=0.0, presence_penalty=0.7, frequency_penalty=0.4),
                    [2, 5, 5, 5, 9])
    got = Sampler()._apply_penalties(logits, [s])
    expected = openai_penalized(logits[0], [2, 5, 5, 5, 9], presence=0.7, frequency=0.4)
    torch.testing.assert_close(got[0], expected)
    assert got[0, 1] == logits[0, 1] and got[0, 0] == logits[0, 0]
    assert got[0, 5] == logits[0, 5] - (0.4 * 3 + 0.7)
    assert not torch.equal(got, logits)  # the caller's tensor is untouched and the copy differs


def test_penalties_change_the_greedy_choice():
    logits = torch.tensor([[3.0, 2.5, 2.0, -1.0]])
    sampler = Sampler()
    s = seq(prompt=[0], temperature=0.0, frequency_penalty=0.3)
    assert sampler.sample(logits, [s]) == [0]  # the prompt's token 0 is not penalized
    with_output(s, [0])
    assert sampler.sample(logits, [s]) == [0]  # 3.0 - 0.3 > 2.5
    with_output(s, [0])
    assert sampler.sample(logits, [s]) == [1]  # 3.0 - 0.6 < 2.5
    p = seq(prompt=[0], temperature=0.0, presence_penalty=2.0)
    with_output(p, [0, 1])
    assert sampler.sample(logits, [p]) == [2]  # 1.0 and 0.5 < 2.0
    neg = seq(prompt=[0], temperature=0.0, presence_penalty=-2.0)
    with_output(neg, [3])
    assert sampler.sample(logits, [neg]) == [0]  # -1.0 + 2.0 still below 3.0
    neg = seq(prompt=[0], temperature=0.0, frequency_penalty=-2.0)
    with_output(neg, [3, 3, 3])
    assert sampler.sample(logits, [neg]) == [3]  # a negative penalty encourages repeats: -1 + 6 = 5


def test_penalties_shift_the_sampled_distribution():
    probs = [0.5, 0.3, 0.2]
    logits = logits_from_probs(probs)
    s = with_output(seq(prompt=[1, 2], temperature=1.0, seed=3, presence_penalty=1.0, frequency_penalty=0.5),
                    [0, 0])
    target = openai_penalized(logits[0], [0, 0], presence=1.0, frequency=0.5).softmax(-1)  # p(0) ~ 0.12
    sampler = Sampler()
    draws = [sampler.sample(logits, [s])[0] for _ in range(2000)]
    freq = [draws.count(t) / len(draws) for t in range(3)]
    for got, want in zip(freq, target.tolist(), strict=True):
        assert abs(got - want) < 0.04
    assert freq[0] < 0.25  # far below the unpenalized 0.5


def test_zero_penalties_are_a_no_op():
    torch.manual_seed(1)
    logits = torch.randn(3, 40)
    seqs = [with_output(seq(f"z{i}", temperature=0.8, seed=i, presence_penalty=0.0, frequency_penalty=0.0),
                        [4, 4, 7]) for i in range(3)]
    sampler = Sampler()
    assert sampler._apply_penalties(logits, seqs) is logits  # no copy, no tensor work
    plain = [with_output(seq(f"p{i}", temperature=0.8, seed=i), [4, 4, 7]) for i in range(3)]
    a = [Sampler().sample(logits, seqs) for _ in range(10)]
    b = [Sampler().sample(logits, plain) for _ in range(10)]
    assert a == b


def test_penalties_are_vectorized_over_a_mixed_batch():
    torch.manual_seed(2)
    vocab = 30
    logits = torch.randn(6, vocab)
    sampler = Sampler(eos_token_ids=[0])
    seqs = [
        with_output(seq("a", prompt=[3, 4], temperature=0.0), [5, 5]),  # no penalty at all
        with_output(seq("b", prompt=[3, 4], temperature=0.0, frequency_penalty=1.5), [5, 5, 6]),
        with_output(seq("c", prompt=[3], temperature=0.7, presence_penalty=-0.5), [7, 8, 8]),
        with_output(seq("d", prompt=[3, 9], temperature=0.0, repetition_penalty=1.3), [9, 10]),
        with_output(seq("e", prompt=[2], temperature=0.0, repetition_penalty=1.2, presence_penalty=0.3,
                        frequency_penalty=-0.2), [2, 11, 11]),
        seq("f", prompt=[1], temperature=0.0, min_tokens=2, frequency_penalty=2.0),  # no output yet
    ]
    got = sampler._apply_penalties(logits, seqs)
    # each row equals the same row sampled alone: batch mates never leak into a row
    for i, s in enumerate(seqs):
        torch.testing.assert_close(got[i], sampler._apply_penalties(logits[i : i + 1], [s])[0])
    torch.testing.assert_close(got[0], logits[0])
    torch.testing.assert_close(got[1], openai_penalized(logits[1], [5, 5, 6], 0.0, 1.5))
    torch.testing.assert_close(got[2], openai_penalized(logits[2], [7, 8, 8], -0.5, 0.0))
    rep = logits[4].clone()
    for t in {2, 11}:  # repetition over prompt and output first, then OpenAI's over the output only
        rep[t] = rep[t] / 1.2 if rep[t] > 0 else rep[t] * 1.2
    torch.testing.assert_close(got[4], openai_penalized(rep, [2, 11, 11], 0.3, -0.2))
    assert got[5, 0] == float("-inf")
    torch.testing.assert_close(got[5, 1:], logits[5, 1:])
    assert sampler.sample(logits, seqs)[1] == int(got[1].argmax())


def test_penalties_accept_non_contiguous_logits():
    torch.manual_seed(3)
    base = torch.randn(2, 20)
    strided = base.t().contiguous().t()  # same values, column-major layout
    assert not strided.is_contiguous()
    seqs = [with_output(seq("s0", temperature=0.0, frequency_penalty=1.0, repetition_penalty=1.5), [3, 3]),
            with_output(seq("s1", temperature=0.0, presence_penalty=0.5), [4])]
    sampler = Sampler()
    torch.testing.assert_close(sampler._apply_penalties(strided, seqs), sampler._apply_penalties(base, seqs))
    assert torch.equal(strided, base)  # untouched


def test_scratch_logits_are_penalised_in_place_to_the_same_values():
    """``scratch=True`` (the engine, while no request asks for logprobs) writes into the logits
    instead of a copy, with the same result; a non-contiguous tensor is still copied."""
    torch.manual_seed(4)
    base = torch.randn(3, 40)
    seqs = [with_output(seq("p0", temperature=0.0, frequency_penalty=1.0, repetition_penalty=1.5), [3, 3]),
            seq("p1", temperature=0.0, logit_bias={7: 100.0}),
            seq("p2", temperature=0.0)]
    sampler = Sampler()
    expected = sampler._apply_penalties(base, seqs)
    assert not torch.equal(expected, base)  # (not in place without scratch)
    scratch = base.clone()
    got = sampler._apply_penalties(scratch, seqs, scratch=True)
    assert got.data_ptr() == scratch.data_ptr()
    torch.testing.assert_close(got, expected)
    scratch = base.clone()
    assert sampler.sample(scratch, seqs, scratch=True) == sampler.sample(base, seqs) == expected.argmax(-1).tolist()
    strided = base.t().contiguous().t()
    torch.testing.assert_close(sampler._apply_penalties(strided, seqs, scratch=True), expected)
    assert torch.equal(strided, base)  # copied, untouched


def test_penalty_params_are_checked():
    SamplingParams(presence_penalty=-2.0, frequency_penalty=2.0)
    for bad in (2.01, -2.5, float("nan")):
        with pytest.raises(ValueError, match="presence_penalty"):
            SamplingParams(presence_penalty=bad)
        with pytest.raises(ValueError, match="frequency_penalty"):
            SamplingParams(frequency_penalty=bad)


@pytest.mark.parametrize("temperature", [1e-38, 1e-45, 5e-324, 1e-300, 9e-6])
def test_a_vanishing_temperature_samples_greedily(temperature):
    """Below 1e-5 a temperature is greedy: dividing by it would overflow float32 logits to inf
    (and softmax to NaN: tokens drawn at random), where the distribution tends to the argmax."""
    torch.manual_seed(3)
    logits = torch.randn(4, 200) * 8
    seqs = [seq(f"t{i}", temperature=temperature, top_k=50 if i % 2 else 0, seed=i) for i in range(4)]
    assert Sampler().sample(logits, seqs) == logits.argmax(-1).tolist()


@pytest.mark.parametrize("penalty", [1e-300, 1e-40, 1e-7])
def test_a_tiny_repetition_penalty_favours_the_seen_tokens_without_overflow(penalty):
    logits = torch.full((1, 50), -1.0)
    logits[0, 7] = 3.0  # an unseen favourite
    logits[0, 2] = 2.0  # a token of the prompt: divided by the penalty, it wins
    s = seq(prompt=(2, 5), temperature=0.0, repetition_penalty=penalty)
    assert Sampler().sample(logits, [s]) == [2]
    s = seq(prompt=(2, 5), temperature=0.7, seed=1, repetition_penalty=penalty)
    assert Sampler().sample(logits, [s]) == [2]


# --------------------------------------------------------------------------------------- logit_bias


def test_logit_bias_is_added_to_the_logits_before_the_choice():
    logits = torch.tensor([[3.0, 2.5, 2.0, -1.0]])
    sampler = Sampler()
    assert sampler.sample(logits, [seq(temperature=0.0, logit_bias={3: 4.5})]) == [3]  # -1 + 4.5 > 3.0
    assert sampler.sample(logits, [seq(temperature=0.0, logit_bias={3: 3.9})]) == [0]  # 2.9 < 3.0
    assert sampler.sample(logits, [seq(temperature=0.0, logit_bias={0: -100})]) == [1]  # -100 bans it
    got = sampler._apply_penalties(logits, [seq(logit_bias={1: 0.25, 3: -2})])
    torch.testing.assert_close(got, torch.tensor([[3.0, 2.75, 2.0, -3.0]]))
    assert logits[0, 1] == 2.5  # the caller's tensor is untouched


def test_logit_bias_comes_before_the_repetition_penalty_as_in_vllm():
    logits = torch.tensor([[3.0, 1.0, 0.0]])
    s = seq(prompt=[0], logit_bias={0: 1.0}, repetition_penalty=2.0)
    assert Sampler()._apply_penalties(logits, [s])[0, 0] == (3.0 + 1.0) / 2.0


def test_logit_bias_rows_are_their_own_in_a_mixed_batch():
    torch.manual_seed(1)
    logits = torch.randn(4, 64)
    seqs = [seq("a", temperature=0.0, logit_bias={5: 100}), seq("b", temperature=0.0),
            seq("c", temperature=0.0, logit_bias={int(logits[2].argmax()): -100}, frequency_penalty=0.5),
            seq("d", temperature=0.0, logit_bias={7: 100, 9: -3.5})]
    got = Sampler()._apply_penalties(logits, seqs)
    expected = logits.clone()
    expected[0, 5] += 100
    expected[2, int(logits[2].argmax())] -= 100
    expected[3, 7] += 100
    expected[3, 9] -= 3.5
    torch.testing.assert_close(got, expected)
    out = Sampler().sample(logits, seqs)
    assert out[0] == 5 and out[3] == 7 and out[1] == int(logits[1].argmax())
    assert out[2] == int(expected[2].argmax()) != int(logits[2].argmax())


def test_a_forced_token_is_drawn_under_sampling_too():
    logits = torch.tensor([[5.0, 4.0, 3.0, 0.0]])
    sampler = Sampler()
    s = seq(temperature=1.0, seed=3, logit_bias={3: 100})
    assert {sampler.sample(logits, [s])[0] for _ in range(50)} == {3}


@pytest.mark.parametrize("bias", [{-1: 1.0}, {True: 1.0}, {"5": 1.0}, {5: 100.5}, {5: float("nan")},
                                  {5: "1"}, {i: 1.0 for i in range(1025)}, [(5, 1.0)]])
def test_logit_bias_is_checked(bias):
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias=bias)


def test_an_empty_logit_bias_is_none():
    assert SamplingParams(logit_bias={}).logit_bias is None
    assert SamplingParams(logit_bias={5: 2}).logit_bias == {5: 2.0}


def test_unseeded_sampling_differs_between_engine_starts_unless_the_engine_is_seeded():
    """Found by QA: every start of the engine drew the same answers for requests without a seed
    (its seed source was seeded with 0). A fresh source each start, as OpenAI's unseeded requests;
    ``EngineConfig.seed`` pins it (tests, benchmarks)."""
    logits = torch.zeros(1, 1000)  # uniform: 40 draws of 1000 tokens never repeat by chance

    def draws(sampler):
        s = seq("u", temperature=1.0)
        return [sampler.sample(logits, [s])[0] for _ in range(40)]

    assert draws(Sampler()) != draws(Sampler())
    assert draws(Sampler(seed=7)) == draws(Sampler(seed=7))


@pytest.mark.parametrize("fields", [{"seed": 1.5}, {"top_k": 2.0}, {"max_tokens": 8.0}, {"min_tokens": 1.5},
                                    {"stop_token_ids": [2.0]}, {"seed": True}])
def test_sampling_params_refuse_a_number_that_is_no_integer(fields):
    """Found by QA: SamplingParams(seed=1.5) was taken, and its sampler's ``seed & mask`` raised in the
    step thread: the engine died for every request. Refused where it is made, as the other checks."""
    with pytest.raises(ValueError, match="integer"):
        SamplingParams(**fields)


def test_sampling_params_take_numpy_integers_as_integers():
    import numpy as np

    params = SamplingParams(max_tokens=np.int64(5), top_k=np.int32(3), seed=np.uint64(7), stop_token_ids=[np.int16(2)])
    assert (params.max_tokens, params.top_k, params.seed, params.stop_token_ids) == (5, 3, 7, [2])
    assert all(type(v) is int for v in (params.max_tokens, params.top_k, params.seed, *params.stop_token_ids))


@pytest.mark.parametrize("kwargs", [
    dict(stop=[1]), dict(stop=b"ab"), dict(stop=["ok", None]), dict(stop=7), dict(stop_token_ids=5),
    dict(temperature=True), dict(top_p=True), dict(temperature="1"), dict(repetition_penalty=None),
    dict(presence_penalty="0"), dict(n=True), dict(n=2.0), dict(ignore_eos="no"), dict(ignore_eos=1),
])
def test_a_value_of_the_wrong_kind_is_refused_where_it_is_made(kwargs):
    """Found by QA: stop=[1] or stop=b"ab" passed and crashed the step loop (every request got
    EngineDeadError); True passed as a temperature, and ignore_eos="no" ignored EOS."""
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)


def test_numpy_numbers_are_numbers():
    import numpy as np

    p = SamplingParams(n=np.int64(2), temperature=np.float32(0.5), top_p=np.float64(0.9), stop=("x",),
                       logprobs=np.int64(2))
    assert (p.n, type(p.n), type(p.temperature), p.stop, p.logprobs, type(p.logprobs)) == (2, int, float, ["x"], 2, int)


@pytest.mark.parametrize("kwargs", [
    dict(max_num_seqs=1.5), dict(seed=1.5), dict(seed="x"), dict(enable_prefix_caching="no"), dict(num_blocks=2.5),
    dict(block_size=True), dict(kv_cache_memory_gb="1"), dict(model=None), dict(max_waiting=None),
])
def test_an_engine_config_of_the_wrong_kind_is_refused_where_it_is_made(kwargs):
    """Found by QA: max_num_seqs=1.5 and seed="x" were taken and failed later with a bare TypeError
    (num_blocks=2.5 at the engine's construction); enable_prefix_caching="no" counted as on."""
    from engine.config import EngineConfig

    with pytest.raises(ValueError):
        EngineConfig(**kwargs)


def test_every_engine_config_field_has_its_kind_checked():
    """A field added without an entry in ``_KINDS`` would go unchecked: the two lists are one."""
    import dataclasses

    from engine.config import _KINDS, _OPTIONAL, EngineConfig

    fields = {f.name for f in dataclasses.fields(EngineConfig)}
    assert set(_KINDS) == fields and _OPTIONAL <= fields
    assert {f.name for f in dataclasses.fields(EngineConfig) if f.default is None} == _OPTIONAL


def test_an_engine_config_takes_numpy_numbers():
    import numpy as np

    from engine.config import EngineConfig

    c = EngineConfig(max_num_seqs=np.int64(8), kv_cache_memory_gb=np.float32(0.5), seed=None)
    assert (c.max_num_seqs, type(c.max_num_seqs), c.kv_cache_memory_gb) == (8, int, 0.5)
