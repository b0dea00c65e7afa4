"""The key proof on the real SmolLM2-135M-Instruct weights (slow): 8 chat prompts of mixed
lengths run together give greedy outputs identical to transformers' greedy ``generate`` run
one prompt at a time (fp32, EOS active), with default settings, small prefill chunks, a pool
small enough to force preemption, and prefix-cache hits."""

from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams

pytestmark = pytest.mark.slow

SYSTEM = "You are a concise assistant. Answer in one or two sentences, plainly and accurately."
QUESTIONS = [
    "Hi!",
    "What is the capital of France?",
    "Explain what a hash table is.",
    "Write a haiku about the sea.",
    "List three prime numbers greater than ten and say why each one is prime, step by step.",
    "Why is the sky blue? Give the physical reason in simple words that a child could follow.",
    "Translate 'good morning' to Spanish.",
    "What does a CPU cache do, and why does it make programs faster? Mention locality of reference.",
]
MAX_NEW = [8, 14, 20, 12, 24, 16, 6, 22]


@pytest.fixture(scope="module")
def smollm2():
    from engine.weights import resolve_model_dir

    model_dir = resolve_model_dir("smollm2-135m-instruct", "./data/weights")

    prompts, expected = chat_prompts_and_hf_greedy(model_dir, SYSTEM, MAX_NEW)
    return model_dir, prompts, expected


def chat_prompts_and_hf_greedy(model_dir, system: str, max_new: list[int]) -> tuple[list[list[int]], list[list[int]]]:
    """The QUESTIONS behind ``system`` as token ids, and transformers' greedy ``generate`` of each,
    one prompt at a time (fp32, EOS active)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    prompts = []
    for q in QUESTIONS:
        ids = tok.apply_chat_template([{"role": "system", "content": system}, {"role": "user", "content": q}],
                                      add_generation_prompt=True, tokenize=True)
        prompts.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    expected = []
    with torch.inference_mode():
        for p, m in zip(prompts, max_new, strict=True):
            g = model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                               max_new_tokens=m, do_sample=False)
            expected.append(g[0, len(p):].tolist())
    return prompts, expected


@pytest.fixture(params=["torch", "native"])
def backend(request):
    """Every proof runs on both CPU attention paths (torch SDPA and the native C kernels)."""
    return request.param


def engine_for(model_dir, backend, **kw):
    cfg = dict(model=str(model_dir), device="cpu", dtype="float32", attention_backend=backend,
               num_blocks=256, max_num_batched_tokens=512)
    cfg.update(kw)
    return LLMEngine(EngineConfig(**cfg))


PARAMS = [SamplingParams(temperature=0.0, max_tokens=m) for m in MAX_NEW]


def test_batched_greedy_with_prefix_hits_equals_hf(smollm2, backend):
    model_dir, prompts, expected = smollm2
    engine = engine_for(model_dir, backend)
    assert engine.generate(prompts[:1], PARAMS[:1]) == expected[:1]
    assert engine.generate(prompts, PARAMS) == expected  # all together, system prompt cached
    assert engine.stats().prefix_hit_rate > 0.3  # the ~32-token system prompt of ~50-token prompts
    assert engine.kv.num_used_blocks == 0


def test_small_prefill_chunks_equal_hf(smollm2, backend):
    model_dir, prompts, expected = smollm2
    engine = engine_for(model_dir, backend, max_num_batched_tokens=16, enable_prefix_caching=False)
    assert engine.generate(prompts, PARAMS) == expected


def test_preemption_equals_hf(smollm2, backend):
    model_dir, prompts, expected = smollm2
    # the longest request just fits alone; all of them together need several times the pool
    longest = max(len(p) + m for p, m in zip(prompts, MAX_NEW, strict=True))
    engine = engine_for(model_dir, backend, num_blocks=-(-longest // 16) + 1, enable_prefix_caching=False)
    assert engine.generate(prompts, PARAMS) == expected
    assert engine.stats().preemptions > 0
    assert engine.kv.num_used_blocks == 0


LONG_SYSTEM = ("You are the support assistant of a hardware shop. Answer in one sentence, plainly, and never "
               "invent prices, stock levels or delivery dates; when unsure, say so and point to the shop's "
               "help page. ") * 6  # ~250 tokens: 8 requests behind it take the prefill cascade


def test_many_requests_behind_a_long_cached_system_prompt_equal_hf(smollm2, backend, monkeypatch):
    """Eight questions behind one ~250-token system prompt, sent together once the prompt is
    cached: the prefill chunks attend its blocks once for all of them (the cascade, taken here)
    and every greedy output still equals transformers' one-prompt-at-a-time ``generate``."""
    import kernels.torch_ops as ops

    model_dir, _, _ = smollm2
    max_new = [6] * len(QUESTIONS)
    prompts, expected = chat_prompts_and_hf_greedy(model_dir, LONG_SYSTEM, max_new)
    taken = []
    real = ops._prefill_cascade
    monkeypatch.setattr(ops, "_prefill_cascade", lambda *a, **k: taken.append(real(*a, **k)) or taken[-1])
    engine = engine_for(model_dir, backend, max_num_batched_tokens=1024)
    params = [SamplingParams(temperature=0.0, max_tokens=m) for m in max_new]
    assert engine.generate(prompts[:1], params[:1]) == expected[:1]
    assert engine.generate(prompts, params) == expected
    assert any(taken), "the prefill cascade was not taken"
