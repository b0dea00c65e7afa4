"""Logprobs from the engine (``SamplingParams.logprobs``): the model's own distribution, equal to
transformers' log-softmax of the same weights' logits at each generated position; computed only
for the rows that ask, whatever their batch mates do."""

from __future__ import annotations

import math
import random

import pytest
import torch

from engine.llm_engine import LLMEngine
from engine.sampling_params import MAX_LOGPROBS, SamplingParams


def _run(engine: LLMEngine, prompts: list[list[int]], params: list[SamplingParams]) -> dict[str, list]:
    """request id -> its deltas in order (every field kept)."""
    ids = []
    for i, (p, sp) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(f"r{i}", p, sp)
        ids.append(f"r{i}")
    deltas: dict[str, list] = {rid: [] for rid in ids}
    while engine.has_unfinished_requests():
        for out in engine.step():
            deltas[out.request_id] += out.deltas
    return deltas


def _hf_logprobs(model_dir, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """transformers' log-softmax over the vocabulary at each of ``tokens``' positions."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1:-1]
    return torch.log_softmax(logits.float(), dim=-1)


def test_logprobs_match_transformers_and_list_the_most_likely(engine_config, tiny_model_dir) -> None:
    rng = random.Random(3)
    prompt = [rng.randrange(256) for _ in range(21)]
    engine = LLMEngine(engine_config(tiny_model_dir))
    # greedy with 5 alternatives, and seeded sampling at a high temperature with top-k: the
    # logprobs are the model's, not the sampling distribution's
    # greedy under a strong penalty: the chosen token is then often not the model's most likely,
    # and the alternatives stay in the model's order
    params = [SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=5),
              SamplingParams(temperature=1.7, top_k=7, seed=11, max_tokens=12, ignore_eos=True, logprobs=2,
                             presence_penalty=1.5),
              SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=3, repetition_penalty=5.0,
                             presence_penalty=2.0)]
    for deltas, sp in zip(_run(engine, [prompt] * 3, params).values(), params, strict=True):
        tokens = [t for d in deltas for t in d.token_ids]
        entries = [e for d in deltas for e in d.logprobs]
        assert len(entries) == len(tokens) == 12
        ref = _hf_logprobs(tiny_model_dir, prompt, tokens)
        for pos, (tok, (lp, top)) in enumerate(zip(tokens, entries, strict=True)):
            assert lp == pytest.approx(ref[pos, tok].item(), abs=2e-4)
            assert len(top) == sp.logprobs
            want = torch.topk(ref[pos], sp.logprobs)
            assert [t for t, _ in top] == want.indices.tolist()
            assert [v for _, v in top] == pytest.approx(want.values.tolist(), abs=2e-4)
            assert all(a >= b for (_, a), (_, b) in zip(top, top[1:], strict=False))
            if sp.greedy and sp.repetition_penalty == 1.0:
                assert top[0][0] == tok and top[0][1] == lp  # the chosen one is the most likely
        assert sum(math.exp(v) for _, v in entries[0][1]) <= 1.0 + 1e-5


def test_only_the_rows_that_ask_get_logprobs_and_mates_change_nothing(engine_config, tiny_model_dir) -> None:
    rng = random.Random(5)
    prompts = [[rng.randrange(256) for _ in range(n)] for n in (9, 30, 4)]
    asks = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=0)
    plain = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    alone = _run(LLMEngine(engine_config(tiny_model_dir)), [prompts[1]], [asks])["r0"]
    together = _run(LLMEngine(engine_config(tiny_model_dir)), prompts, [plain, asks, plain])
    assert all(d.logprobs is None for rid in ("r0", "r2") for d in together[rid])
    got = [e for d in together["r1"] for e in d.logprobs]
    want = [e for d in alone for e in d.logprobs]
    assert [t for d in together["r1"] for t in d.token_ids] == [t for d in alone for t in d.token_ids]
    assert [lp for lp, _ in got] == pytest.approx([lp for lp, _ in want], abs=1e-5)
    assert all(top == () for _, top in got)  # logprobs=0: the chosen token's only


def test_each_choice_of_n_gets_its_own(engine_config, tiny_model_dir) -> None:
    prompt = list(range(10, 30))
    sp = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=5, ignore_eos=True, logprobs=1)
    deltas = _run(LLMEngine(engine_config(tiny_model_dir)), [prompt], [sp])["r0"]
    for index in range(3):
        mine = [d for d in deltas if d.index == index]
        tokens = [t for d in mine for t in d.token_ids]
        ref = _hf_logprobs(tiny_model_dir, prompt, tokens)
        for pos, d in enumerate(mine):
            (lp, top), = d.logprobs
            assert lp == pytest.approx(ref[pos, d.token_ids[0]].item(), abs=2e-4)
            assert top[0][0] == int(ref[pos].argmax())


@pytest.mark.parametrize("value", [-1, MAX_LOGPROBS + 1, 2.5, True])
def test_logprobs_out_of_range_are_refused(value: int) -> None:
    with pytest.raises(ValueError, match="logprobs must be between 0 and 20"):
        SamplingParams(logprobs=value)


def test_a_closing_eos_has_no_entry_and_nothing_is_computed_unasked(engine_config, tiny_model_dir) -> None:
    """A choice that stops on EOS lists no entry for it (its text has none); with no request asking,
    the sampler's logprobs are never called."""
    engine = LLMEngine(engine_config(tiny_model_dir))
    prompt = list(range(40, 60))
    probe = _run(engine, [prompt], [SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)])["r0"]
    third = [t for d in probe for t in d.token_ids][2]
    engine._silent_ids = frozenset({third})  # as if the greedy third token were EOS
    engine.eos_token_ids = engine.sampler.eos_token_ids = [third]
    calls = []
    original = engine.sampler.logprobs
    engine.sampler.logprobs = lambda *a: calls.append(1) or original(*a)
    deltas = list(_run(engine, [prompt], [SamplingParams(temperature=0.0, max_tokens=4, logprobs=1)]).values())[0]
    assert [d.finish_reason for d in deltas][-1] == "stop"
    assert [len(d.logprobs) for d in deltas] == [1, 1, 0]  # the EOS token: none
    assert len(calls) == 3
    _run(engine, [prompt], [SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)])
    assert len(calls) == 3 and engine._with_logprobs == 0  # nobody asked: never called


def test_logit_bias_steers_the_output_but_not_the_logprobs(engine_config, tiny_model_dir) -> None:
    """A token biased by +100 is chosen at every step; its logprobs stay the model's own; a batch
    mate without a bias is unchanged; a key outside the vocabulary is refused."""
    prompt = list(range(60, 80))
    plain = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    alone = _run(LLMEngine(engine_config(tiny_model_dir)), [prompt], [plain])["r0"]
    forced = [t for d in alone for t in d.token_ids][0] ^ 1  # not the model's own first choice
    biased = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True, logprobs=1, logit_bias={forced: 100})
    engine = LLMEngine(engine_config(tiny_model_dir))
    both = _run(engine, [prompt, prompt], [biased, plain])
    tokens = [t for d in both["r0"] for t in d.token_ids]
    assert tokens == [forced] * 5
    ref = _hf_logprobs(tiny_model_dir, prompt, tokens)
    for pos, (lp, top) in enumerate(e for d in both["r0"] for e in d.logprobs):
        assert lp == pytest.approx(ref[pos, forced].item(), abs=2e-4)
        assert top[0][0] == int(ref[pos].argmax())
    assert [t for d in both["r1"] for t in d.token_ids] == [t for d in alone for t in d.token_ids]
    vocab = engine.model.arch.vocab_size
    with pytest.raises(ValueError, match="logit_bias"):
        engine.add_request("bad", prompt, SamplingParams(logit_bias={vocab: 1.0}))


def _first_outputs(engine: LLMEngine, prompts: list[list[int]], params: list[SamplingParams]) -> dict:
    """request id -> (every output in order); runs all to the end."""
    for i, (p, sp) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(f"s{i}", p, sp)
    outs: dict[str, list] = {f"s{i}": [] for i in range(len(prompts))}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outs[out.request_id].append(out)
    return outs


def test_prompt_logprobs_match_transformers_over_a_chunked_prefill(engine_config, tiny_model_dir) -> None:
    """A 150-token prompt in chunks of 64 (``max_num_batched_tokens``), beside a plain request:
    each prompt token's logprob and its 4 most likely are transformers' log-softmax at the position
    before it; the first token has none; they come once, with the first output."""
    rng = random.Random(8)
    prompt = [rng.randrange(256) for _ in range(150)]
    other = [rng.randrange(256) for _ in range(40)]
    engine = LLMEngine(engine_config(tiny_model_dir))
    scoring = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True, prompt_logprobs=4)
    plain = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    outs = _first_outputs(engine, [other, prompt], [plain, scoring])
    assert all(o.prompt_logprobs is None for o in outs["s0"])
    first, *rest = outs["s1"]
    assert all(o.prompt_logprobs is None for o in rest)
    got = first.prompt_logprobs
    assert len(got) == len(prompt) and got[0] is None
    ref = _hf_logprobs(tiny_model_dir, prompt[:1], prompt[1:])  # row j - 1: the distribution of token j
    for j in range(1, len(prompt)):
        lp, top, rank = got[j]
        assert lp == pytest.approx(ref[j - 1, prompt[j]].item(), abs=2e-4)
        # its rank among the model's (vLLM's): 1 when it is the most likely; off by one only on a
        # near-tie (the two computations differ in the last bits)
        assert abs(rank - (int((ref[j - 1] > ref[j - 1, prompt[j]]).sum()) + 1)) <= 1
        assert (rank == 1) == (top[0][0] == prompt[j])
        want = torch.topk(ref[j - 1], 4)
        assert [t for t, _ in top] == want.indices.tolist()
        assert [v for _, v in top] == pytest.approx(want.values.tolist(), abs=2e-4)
    # the generated tokens are those of the same prompt without scoring
    alone = _first_outputs(LLMEngine(engine_config(tiny_model_dir)), [prompt], [plain])["s0"]
    assert [t for o in outs["s1"] for d in o.deltas for t in d.token_ids] == \
        [t for o in alone for d in o.deltas for t in d.token_ids]


def test_a_scored_prompt_skips_the_prefix_cache_and_fills_it(engine_config, tiny_model_dir) -> None:
    """The prefix cache holds no logits: a prompt to score is computed whole even when its blocks
    are cached (cached tokens 0, every position scored), and leaves its blocks for later requests."""
    rng = random.Random(9)
    prompt = [rng.randrange(256) for _ in range(70)]
    engine = LLMEngine(engine_config(tiny_model_dir, block_size=16))
    plain = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    scoring = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True, prompt_logprobs=0)
    assert _first_outputs(engine, [prompt], [plain])["s0"][0].cached_prompt_tokens == 0
    scored = _first_outputs(engine, [prompt], [scoring])["s0"][0]
    assert scored.cached_prompt_tokens == 0
    assert scored.prompt_logprobs[0] is None and all(e is not None and e[1] == () for e in scored.prompt_logprobs[1:])
    again = _first_outputs(engine, [prompt], [plain])["s0"][0]
    assert again.cached_prompt_tokens == 64 and again.prompt_logprobs is None


def test_max_tokens_zero_scores_the_prompt_and_generates_nothing(engine_config, tiny_model_dir) -> None:
    rng = random.Random(10)
    prompt = [rng.randrange(256) for _ in range(30)]
    engine = LLMEngine(engine_config(tiny_model_dir))
    params = SamplingParams(temperature=0.0, max_tokens=0, n=2, prompt_logprobs=1, logprobs=1)
    outs = _first_outputs(engine, [prompt], [params])["s0"]
    assert len(outs) == 1 and outs[0].finished
    assert sorted((d.index, d.token_ids, d.finish_reason, d.num_tokens, d.logprobs) for d in outs[0].deltas) == \
        [(0, [], "length", 0, []), (1, [], "length", 0, [])]
    assert len(outs[0].prompt_logprobs) == 30
    ref = _hf_logprobs(tiny_model_dir, prompt[:1], prompt[1:])
    assert outs[0].prompt_logprobs[5][0] == pytest.approx(ref[4, prompt[5]].item(), abs=2e-4)
    stats = engine.stats()
    assert (stats.running, stats.waiting, stats.generated_tokens) == (0, 0, 0)
    assert engine.kv.num_used_blocks == 0


def test_prompt_logprobs_and_max_tokens_zero_are_checked() -> None:
    assert SamplingParams(max_tokens=0).max_tokens == 0  # the prompt computed (and cached), nothing generated
    with pytest.raises(ValueError, match="max_tokens must be >= 0"):
        SamplingParams(max_tokens=-1, prompt_logprobs=0)
    for bad in (MAX_LOGPROBS + 1, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="prompt_logprobs must be between"):
            SamplingParams(prompt_logprobs=bad)
    assert SamplingParams(max_tokens=0, prompt_logprobs=MAX_LOGPROBS).prompt_logprobs == MAX_LOGPROBS


def test_prompt_logprobs_survive_preemption(engine_config, tiny_model_dir) -> None:
    """In a pool too small for the batch, requests are preempted and computed again (a scored
    prompt mid-prefill too): every scored prompt's logprobs are still the roomy engine's."""
    rng = random.Random(11)
    prompts = [[rng.randrange(256) for _ in range(rng.randrange(40, 120))] for _ in range(6)]
    params = [SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True,
                             prompt_logprobs=2 if i % 2 else None) for i in range(6)]
    roomy = _first_outputs(LLMEngine(engine_config(tiny_model_dir, num_blocks=128, max_num_batched_tokens=256)),
                           prompts, params)
    tight_engine = LLMEngine(engine_config(tiny_model_dir, num_blocks=12, max_num_batched_tokens=32))
    tight = _first_outputs(tight_engine, prompts, params)
    assert tight_engine.stats().preemptions > 0
    for rid in roomy:
        want = [o.prompt_logprobs for o in roomy[rid] if o.prompt_logprobs is not None]
        got = [o.prompt_logprobs for o in tight[rid] if o.prompt_logprobs is not None]
        assert len(got) == len(want) == (1 if int(rid[1:]) % 2 else 0)
        for a, b in zip(got, want, strict=True):
            assert a[0] is None and b[0] is None and len(a) == len(b)
            assert [e[0] for e in a[1:]] == pytest.approx([e[0] for e in b[1:]], abs=1e-4)
            assert [[t for t, _ in e[1]] for e in a[1:]] == [[t for t, _ in e[1]] for e in b[1:]]


def test_a_prompt_of_the_whole_context_is_scored_with_max_tokens_zero(engine_config, tiny_model_dir) -> None:
    """Found by QA: a prompt of exactly ``max_model_len`` tokens could not be scored (prompt + 1 was
    checked); with ``max_tokens`` 0 nothing follows it. One token more is still too long."""
    from engine.outputs import PromptTooLongError

    engine = LLMEngine(engine_config(tiny_model_dir, max_model_len=96))
    rng = random.Random(12)
    prompt = [rng.randrange(256) for _ in range(96)]
    out = _first_outputs(engine, [prompt], [SamplingParams(max_tokens=0, prompt_logprobs=0)])["s0"]
    assert len(out[0].prompt_logprobs) == 96 and out[0].finished
    with pytest.raises(PromptTooLongError):
        engine.add_request("long", prompt, SamplingParams(max_tokens=1))
    with pytest.raises(PromptTooLongError):
        engine.add_request("longer", prompt + [1], SamplingParams(max_tokens=0))
    plain = _first_outputs(engine, [prompt[:50]], [SamplingParams(max_tokens=0)])["s0"]  # no scoring: cached
    assert [(d.token_ids, d.finish_reason) for d in plain[0].deltas] == [([], "length")]
    again = _first_outputs(engine, [prompt[:50] + [7]], [SamplingParams(max_tokens=1)])["s0"]
    assert again[0].cached_prompt_tokens == 48  # the three full blocks the unscored prompt left
