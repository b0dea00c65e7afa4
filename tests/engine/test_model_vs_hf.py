"""The key proof: greedy outputs of the paged engine, with many prompts of mixed lengths run
together, equal Hugging Face transformers' greedy ``generate`` run one prompt at a time on the
same weights (fp32) - also with small prefill chunks, a pool small enough to force preemption,
prefix-cache hits and copy-on-write forks."""

from __future__ import annotations

import random

import pytest
import torch

from engine.linear import onednn_available
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams


def make_prompts(seed: int, n: int = 10, vocab: int = 256, shared_prefix: int = 0):
    rng = random.Random(seed)
    prefix = [rng.randrange(vocab) for _ in range(shared_prefix)]
    lengths = [1, 3, 17, 40, 64, 5, 90, 33, 150, 16][:n]
    prompts = [prefix + [rng.randrange(vocab) for _ in range(length)] for length in lengths]
    max_new = [rng.randint(8, 40) for _ in range(n)]
    return prompts, max_new


def hf_greedy(model_dir, prompts, max_new):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    outs = []
    with torch.inference_mode():
        for p, m in zip(prompts, max_new, strict=True):
            g = model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                               max_new_tokens=m, min_new_tokens=m, do_sample=False, pad_token_id=0)
            outs.append(g[0, len(p):].tolist())
    return outs


@pytest.fixture(scope="module", params=["torch", "native"])
def backend(request):
    """Every proof runs on both CPU attention paths (torch SDPA and the native C kernels)."""
    return request.param


@pytest.fixture(scope="module")
def run_engine(engine_config, backend):
    return lambda *a, **kw: _run_engine(engine_config, backend, *a, **kw)


def _run_engine(engine_config, backend, model_dir, prompts, max_new, **cfg):
    engine = LLMEngine(engine_config(model_dir, attention_backend=backend, **cfg))
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in max_new]
    return engine, engine.generate(prompts, params)


@pytest.fixture(scope="module")
def case(tiny_model_dir):
    prompts, max_new = make_prompts(0)
    return tiny_model_dir, prompts, max_new, hf_greedy(tiny_model_dir, prompts, max_new)


def test_batched_greedy_equals_hf(case, run_engine):
    model_dir, prompts, max_new, expected = case
    engine, got = run_engine(model_dir, prompts, max_new, num_blocks=128, max_num_batched_tokens=512)
    assert got == expected
    assert engine.kv.num_free_blocks == 128


def test_small_prefill_chunks_equal_hf(case, run_engine):
    model_dir, prompts, max_new, expected = case
    engine, got = run_engine(model_dir, prompts, max_new, num_blocks=128, max_num_batched_tokens=16)
    assert got == expected
    assert engine.num_steps > 40


def test_preemption_equal_hf(case, run_engine):
    model_dir, prompts, max_new, expected = case
    # 13 blocks x 16 = 208 slots: the longest request (150 + its tokens) fits alone, not with others
    engine, got = run_engine(model_dir, prompts, max_new, num_blocks=13, max_num_batched_tokens=64)
    assert engine.stats().preemptions > 0
    assert got == expected
    assert engine.kv.num_free_blocks == 13


def test_prefix_cache_hits_equal_hf(tiny_model_dir, engine_config, backend):
    prompts, max_new = make_prompts(1, n=8, shared_prefix=48)
    expected = hf_greedy(tiny_model_dir, prompts, max_new)
    engine = LLMEngine(engine_config(tiny_model_dir, num_blocks=128, max_num_batched_tokens=256,
                                     attention_backend=backend))
    warm = engine.generate([prompts[0]], SamplingParams(temperature=0.0, max_tokens=max_new[0], ignore_eos=True))
    assert warm == [expected[0]]
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in max_new]
    got = engine.generate(prompts, params)
    assert got == expected
    stats = engine.stats()
    assert stats.prefix_hit_rate > 0.3
    # the same prompts again: nearly everything is served from the cache
    assert engine.generate(prompts, params) == expected


def test_forked_greedy_children_equal_hf(case, engine_config, backend):
    """n > 1 with greedy: every child must equal HF; children share the prompt blocks and copy
    the partial last block on their first write."""
    model_dir, prompts, max_new, expected = case
    engine = LLMEngine(engine_config(model_dir, num_blocks=128, max_num_batched_tokens=128,
                                     attention_backend=backend))
    rid = "fork"
    engine.add_request(rid, prompts[3], SamplingParams(n=3, temperature=0.0, max_tokens=max_new[3], ignore_eos=True))
    choices: dict[int, list[int]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            for d in out.deltas:
                choices.setdefault(d.index, []).extend(d.token_ids)
    assert choices == {i: expected[3] for i in range(3)}
    assert engine.kv.num_free_blocks == 128


def test_llama3_rope_untied_equals_hf(tiny_llama3_dir, run_engine):
    prompts, max_new = make_prompts(2, n=8)
    expected = hf_greedy(tiny_llama3_dir, prompts, max_new)
    _, got = run_engine(tiny_llama3_dir, prompts, max_new, num_blocks=128, max_num_batched_tokens=32)
    assert got == expected


def test_seeded_sampling_unaffected_by_preemption_and_batching(tiny_model_dir, engine_config):
    prompts, max_new = make_prompts(3, n=6)
    params = [SamplingParams(temperature=0.8, top_p=0.9, seed=i, max_tokens=m, ignore_eos=True)
              for i, m in enumerate(max_new)]
    roomy = LLMEngine(engine_config(tiny_model_dir, num_blocks=128, max_num_batched_tokens=512))
    tight = LLMEngine(engine_config(tiny_model_dir, num_blocks=8, max_num_batched_tokens=32))
    together = roomy.generate(prompts, params)
    assert tight.generate(prompts, params) == together
    assert tight.stats().preemptions > 0
    alone = [roomy.generate([p], [sp])[0] for p, sp in zip(prompts[:3], params[:3], strict=True)]
    assert alone == together[:3]


@pytest.mark.skipif(not onednn_available(torch.bfloat16),
                    reason="mixed bf16 needs oneDNN's bf16 linears (AVX-512 or AVX-NE-CONVERT); this CPU runs plain bf16")
def test_mixed_bf16_paths_agree(tiny_model_dir, engine_config):
    """bf16 weights and KV cache under fp32 activations: the native kernels and the torch path
    compute the same thing (no fp32 reference exists for bf16; they must agree with each other)."""
    prompts, max_new = make_prompts(3)
    outs = {}
    for backend in ("torch", "native"):
        engine = LLMEngine(engine_config(tiny_model_dir, dtype="bfloat16", num_blocks=128, max_num_batched_tokens=256,
                                         attention_backend=backend))
        assert engine.model.act_dtype == torch.float32 and engine.runner.kv_caches[0][0].dtype == torch.bfloat16
        params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in max_new]
        outs[backend] = engine.generate(prompts, params)
    assert outs["torch"] == outs["native"]


def test_slots_given_to_another_class_equal_hf(case, engine_config, backend):
    """Tenant a's requests take every running slot; tenant b's, arriving later, get slots that a's
    newest sequences give up (recomputed later from their tokens): every output still equals HF."""
    model_dir, prompts, max_new, expected = case
    engine = LLMEngine(engine_config(model_dir, num_blocks=128, max_num_batched_tokens=512, max_num_seqs=4,
                                     attention_backend=backend))
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in max_new]
    got: dict[str, list[int]] = {}

    def step() -> None:
        for out in engine.step():
            for d in out.deltas:
                got.setdefault(out.request_id, []).extend(d.token_ids)

    for i in range(6):
        engine.add_request(f"a{i}", prompts[i], params[i], priority_class="a")
    for _ in range(3):
        step()
    assert len(engine.scheduler.running) == 4
    for i in range(6, 10):
        engine.add_request(f"b{i}", prompts[i], params[i], priority_class="b")
    while engine.has_unfinished_requests():
        step()
    assert engine.scheduler.num_yields >= 2
    assert [got[f"a{i}"] for i in range(6)] + [got[f"b{i}"] for i in range(6, 10)] == expected
    assert engine.kv.num_free_blocks == 128
