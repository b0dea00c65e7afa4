"""LLMEngine behaviour on the tiny model: finishing rules, abort, errors, forks, stats."""

from __future__ import annotations

import json
import shutil

import pytest

from engine.llm_engine import LLMEngine
from engine.outputs import PromptTooLongError
from engine.sampling_params import SamplingParams

GREEDY = dict(temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(tiny_model_dir, engine_config):
    return LLMEngine(engine_config(tiny_model_dir, num_blocks=64, max_num_batched_tokens=64))


def run(engine, rid, prompt, params):
    engine.add_request(rid, prompt, params)
    outs = []
    while engine.has_unfinished_requests():
        outs += [o for o in engine.step() if o.request_id == rid]
    return outs


def test_max_tokens_gives_length(engine):
    outs = run(engine, "len", [1, 2, 3], SamplingParams(max_tokens=7, **GREEDY))
    assert outs[-1].finished and outs[-1].deltas[-1].finish_reason == "length"
    assert sum(len(d.token_ids) for o in outs for d in o.deltas) == 7
    assert outs[-1].deltas[-1].num_tokens == 7
    assert all(not o.finished for o in outs[:-1])


def test_stop_token_ids_stop_and_are_counted(engine):
    full = engine.generate([[5, 6, 7]], SamplingParams(max_tokens=20, **GREEDY))[0]
    stop_tok = full[4]
    cut = full.index(stop_tok) + 1
    got = engine.generate([[5, 6, 7]], SamplingParams(max_tokens=20, stop_token_ids=[stop_tok], **GREEDY))[0]
    assert got == full[:cut]
    # min_tokens keeps it going past the stop token
    got = engine.generate([[5, 6, 7]], SamplingParams(max_tokens=20, min_tokens=cut + 1,
                                                      stop_token_ids=[stop_tok], **GREEDY))[0]
    assert len(got) > cut and stop_tok not in got[:cut - 1]


def test_eos_stops_unless_ignored(tiny_model_dir, engine_config, tmp_path):
    base = LLMEngine(engine_config(tiny_model_dir))
    full = base.generate([[9, 8, 7]], SamplingParams(max_tokens=20, **GREEDY))[0]
    eos = full[3]
    model_dir = tmp_path / "eos-model"
    shutil.copytree(tiny_model_dir, model_dir)
    cfg = json.loads((model_dir / "config.json").read_text())
    cfg["eos_token_id"] = eos
    (model_dir / "config.json").write_text(json.dumps(cfg))
    (model_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    e = LLMEngine(engine_config(model_dir))
    assert eos in e.eos_token_ids
    stopped = e.generate([[9, 8, 7]], SamplingParams(temperature=0.0, max_tokens=20))[0]
    first = min(i for i, t in enumerate(full) if t in e.eos_token_ids)  # the tokenizer's EOS counts too
    assert stopped == full[: first + 1]
    assert e.generate([[9, 8, 7]], SamplingParams(max_tokens=20, **GREEDY))[0] == full


def test_stop_string_is_not_emitted(engine):
    prompt = list(b"Hello there, ")
    outs = run(engine, "text", prompt, SamplingParams(max_tokens=30, **GREEDY))
    text = "".join(d.text for o in outs for d in o.deltas)
    clean = [i for i in range(1, len(text) - 2) if "\ufffd" not in text[i : i + 2]]
    assert clean, text
    stop = text[clean[0] : clean[0] + 2]
    outs = run(engine, "text2", prompt, SamplingParams(max_tokens=30, stop=[stop], **GREEDY))
    got = "".join(d.text for o in outs for d in o.deltas)
    assert got == text[: text.index(stop)]
    assert outs[-1].deltas[-1].finish_reason == "stop"


def test_abort_frees_every_block(tiny_model_dir, engine_config):
    e = LLMEngine(engine_config(tiny_model_dir, num_blocks=32, max_num_batched_tokens=32, max_num_seqs=2))
    for i in range(4):
        e.add_request(f"r{i}", list(range(i, i + 30)), SamplingParams(n=2 if i == 0 else 1, max_tokens=50, **GREEDY))
    for _ in range(5):
        e.step()
    assert e.kv.num_used_blocks > 0 and e.stats().waiting > 0
    for i in range(4):
        assert e.abort_request(f"r{i}")
    assert e.kv.num_free_blocks == 32 and not e.kv.tables
    outs = e.step()
    assert sorted(o.request_id for o in outs) == [f"r{i}" for i in range(4)]
    assert all(o.finished and o.deltas[0].finish_reason == "abort" for o in outs)
    assert not e.has_unfinished_requests() and not e.abort_request("r0")


def test_prompt_too_long(tiny_model_dir, engine_config):
    e = LLMEngine(engine_config(tiny_model_dir, max_model_len=32))
    with pytest.raises(PromptTooLongError):
        e.add_request("x", list(range(32)), SamplingParams())
    e.add_request("ok", list(range(31)), SamplingParams(max_tokens=100, **GREEDY))
    out = e.generate([list(range(31))], SamplingParams(max_tokens=100, **GREEDY))[0]
    assert len(out) == 1  # the context is full after one token: finish "length"


def test_pool_bounds_max_model_len(tiny_model_dir, engine_config):
    e = LLMEngine(engine_config(tiny_model_dir, num_blocks=4))
    assert e.max_model_len == 4 * 16


def test_parallel_sampling_children_differ_and_are_seeded(engine):
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=12, ignore_eos=True)

    def choices(rid):
        out = {}
        for o in run(engine, rid, [1, 2, 3, 4, 5], params):
            for d in o.deltas:
                out.setdefault(d.index, []).extend(d.token_ids)
        return out

    a, b = choices("p1"), choices("p2")
    assert a == b and sorted(a) == [0, 1, 2]
    assert len({tuple(v) for v in a.values()}) > 1
    assert engine.kv.num_used_blocks == 0


def test_stats_and_request_metrics(tiny_model_dir, engine_config):
    e = LLMEngine(engine_config(tiny_model_dir, num_blocks=64, max_num_batched_tokens=256))
    assert e.stats().kv_utilization == 0.0  # idle: nothing held (it read 1.0, "full", found by QA)
    system = list(range(100, 148))  # 3 full blocks
    e.generate([system + [1]], SamplingParams(max_tokens=2, **GREEDY))
    e.add_request("m", system + [2, 3], SamplingParams(max_tokens=5, **GREEDY))
    e.step()
    s = e.stats()
    assert s.running == 1 and s.waiting == 0 and 0 < s.kv_usage <= 1
    assert 0.5 < s.kv_utilization <= 1.0
    outs = []
    while e.has_unfinished_requests():
        outs += e.step()
    last = outs[-1]
    assert last.cached_prompt_tokens == 48 and last.prompt_tokens == 50
    m = last.metrics
    assert m.queue_time is not None and m.ttft >= m.queue_time and len(m.inter_token_times) == 4
    s = e.stats()
    assert s.prefix_hit_rate == pytest.approx(48 / (49 + 50))
    assert s.generated_tokens == 7 and s.steps >= 5 and s.kv_blocks_used == 0


def test_duplicate_and_invalid_requests(engine):
    engine.add_request("dup", [1], SamplingParams(max_tokens=1))
    with pytest.raises(ValueError):
        engine.add_request("dup", [1], SamplingParams(max_tokens=1))
    with pytest.raises(ValueError):
        engine.add_request("bad", [10_000], SamplingParams(max_tokens=1))
    with pytest.raises(ValueError):  # would index the logits out of range in the step thread
        engine.add_request("bad2", [1], SamplingParams(max_tokens=1, min_tokens=1, stop_token_ids=[10_000]))
    for prompt, salt in (([1.5], None), ([1], 7), ([1], "\ud800")):  # (found by QA: the step crashed)
        with pytest.raises(ValueError):
            engine.add_request("bad3", prompt, SamplingParams(max_tokens=1), salt=salt)
    import numpy as np  # a NumPy array of ids is a prompt (a re-check: "truth value ... ambiguous")

    engine.add_request("np", np.array([1, 2, 3]), SamplingParams(max_tokens=1))
    engine.abort_request("np")
    engine.abort_request("dup")
    engine.step()


def test_a_batch_refused_partway_leaves_nothing_behind(engine):
    """Found by QA: when generate() refused its second prompt (too long), the first stayed in the
    engine and ran, unasked, during the next call (and was counted)."""
    with pytest.raises(PromptTooLongError):
        engine.generate([[1, 2], list(range(5000))], SamplingParams(max_tokens=3))
    with pytest.raises(ValueError):
        engine.generate([[1, 2], [3]], [SamplingParams(max_tokens=3)])  # (fewer params than prompts)
    assert not engine.requests and not engine.has_unfinished_requests()
    generated = engine.stats().generated_tokens
    once = SamplingParams(max_tokens=2, ignore_eos=True, temperature=0)
    assert len(engine.generate([[5, 6]], once)[0]) == 2
    assert engine.stats().generated_tokens == generated + 2  # its own tokens only


@pytest.mark.parametrize(("change", "said"), [
    (dict(num_hidden_layers=1), "have 2 layers, its config.json 1"),
    (dict(num_key_value_heads=4), "k_proj.weight is [32, 64], the config makes it [64, 64]"),
    (dict(intermediate_size=100), "gate_proj.weight is [128, 64], the config makes it [100, 64]"),
    (dict(num_hidden_layers=3), "have no model.layers.2."),
])
def test_weights_that_do_not_fit_the_config_are_refused(tiny_model_dir, engine_config, tmp_path, change, said):
    """Found by QA: a config.json edited to 20 layers (of 30), 9 KV heads (of 3) or another MLP width
    loaded without a word and answered nonsense, or nothing, with exit status 0."""
    bent = tmp_path / "model"
    shutil.copytree(tiny_model_dir, bent)
    config = json.loads((bent / "config.json").read_text())
    (bent / "config.json").write_text(json.dumps(config | change))
    with pytest.raises(ValueError) as err:
        LLMEngine(engine_config(bent))
    assert said in str(err.value)


def test_the_triton_backend_without_a_gpu_or_its_interpreter_is_refused_before_loading(tiny_model_dir, engine_config,
                                                                                       monkeypatch):
    """Found by QA: attention_backend="triton" on a CPU, without TRITON_INTERPRET=1, built an
    engine that failed at the first step, for every request, with a traceback."""
    pytest.importorskip("triton")
    from kernels import triton_attention

    monkeypatch.setattr(triton_attention, "_paged_attention_kernel", object())  # as compiled for a GPU
    with pytest.raises(ValueError, match="attention_backend 'triton' cannot run on cpu"):
        LLMEngine(engine_config(tiny_model_dir, attention_backend="triton"))


def test_generate_returns_every_choice_when_n_is_above_one(engine):
    seeded = SamplingParams(n=3, temperature=1.0, seed=11, max_tokens=6, ignore_eos=True)
    greedy = SamplingParams(max_tokens=4, **GREEDY)
    single = engine.generate([[1, 2, 3], [4, 5]], greedy)  # all n == 1: one token list per prompt
    assert len(single) == 2 and all(isinstance(t, int) for out in single for t in out)
    assert [len(out) for out in single] == [4, 4]
    both = engine.generate([[1, 2, 3, 4, 5], [4, 5]], [seeded, greedy])  # any n > 1: choices per prompt
    assert [len(choices) for choices in both] == [3, 1]
    assert all(len(c) == 6 for c in both[0]) and both[1] == [single[1]]
    by_index: dict[int, list[int]] = {}
    for o in run(engine, "gen-n", [1, 2, 3, 4, 5], seeded):  # same seed, step by step: same choices, in order
        for d in o.deltas:
            by_index.setdefault(d.index, []).extend(d.token_ids)
    assert both[0] == [by_index[i] for i in range(3)]
    assert engine.kv.num_used_blocks == 0


def test_a_max_model_len_over_the_pool_is_capped_and_said(tiny_model_dir, engine_config, caplog):
    """Found by QA: ``PAGEGATE_MAX_MODEL_LEN=512`` with a pool of 320 tokens served 320 with nothing
    said; the cap is logged once at start (an unset length capped by the pool is the design: not)."""
    with caplog.at_level("WARNING", logger="engine.llm_engine"):
        capped = LLMEngine(engine_config(tiny_model_dir, num_blocks=4, max_model_len=100))
    assert capped.max_model_len == 4 * capped.config.block_size
    assert any("max_model_len 100 is capped at 64" in r.getMessage() for r in caplog.records), caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="engine.llm_engine"):
        LLMEngine(engine_config(tiny_model_dir, num_blocks=4, max_model_len=64))
        LLMEngine(engine_config(tiny_model_dir, num_blocks=4))
    assert not [r for r in caplog.records if "capped" in r.getMessage()]
