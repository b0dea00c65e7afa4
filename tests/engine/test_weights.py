"""engine.weights: bundled GGUF conversion (cached), local directories used as is, clear errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from engine import weights
from engine.weights import BUNDLED_MODEL_ID, resolve_model_dir, served_name

# The same cache `pagegate` uses when started from the repository root, so the one-time
# conversion is shared with the other slow tests and with `make run`.
SHARED_CACHE = Path(__file__).resolve().parents[2] / "data" / "weights"


def test_local_dir_is_used_as_is(tiny_model_dir: Path) -> None:
    before = weights.conversions
    assert resolve_model_dir(str(tiny_model_dir), "/nonexistent-cache") == tiny_model_dir.resolve()
    assert weights.conversions == before
    assert served_name(str(tiny_model_dir) + "/") == tiny_model_dir.name
    assert served_name(BUNDLED_MODEL_ID) == BUNDLED_MODEL_ID


def test_unknown_model_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown model .*smollm2-135m-instruct"):
        resolve_model_dir(str(tmp_path / "missing"), str(tmp_path))
    with pytest.raises(ValueError, match="unknown model"):
        resolve_model_dir("gpt-4o", str(tmp_path))


def test_incomplete_directories_are_clear_errors(tmp_path: Path, tiny_model_dir: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="no config.json"):
        resolve_model_dir(str(empty), str(tmp_path))

    no_weights = tmp_path / "no_weights"
    no_weights.mkdir()
    shutil.copy(tiny_model_dir / "config.json", no_weights / "config.json")
    (no_weights / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="no \\*.safetensors"):
        resolve_model_dir(str(no_weights), str(tmp_path))

    a_file = tmp_path / "weights.txt"
    a_file.write_text("x")
    with pytest.raises(ValueError, match="not a directory"):
        resolve_model_dir(str(a_file), str(tmp_path))


def test_non_llama_architecture_is_rejected(tmp_path: Path, tiny_model_dir: Path) -> None:
    gpt2 = tmp_path / "gpt2"
    shutil.copytree(tiny_model_dir, gpt2)
    config = json.loads((gpt2 / "config.json").read_text())
    config.update(model_type="gpt2", architectures=["GPT2LMHeadModel"])
    (gpt2 / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="unsupported architecture.*GPT2LMHeadModel.*Llama-family"):
        resolve_model_dir(str(gpt2), str(tmp_path))


def test_iter_safetensors_yields_every_tensor(tiny_model_dir: Path) -> None:
    from safetensors.torch import load_file

    expected = load_file(str(tiny_model_dir / "model.safetensors"))
    got = dict(weights.iter_safetensors(tiny_model_dir))
    assert got.keys() == expected.keys()
    assert all(torch.equal(got[k], expected[k]) for k in expected)


def test_gguf_cache_is_atomic_and_follows_its_source(tmp_path: Path, monkeypatch) -> None:
    """The cache logic around the (slow) converter, with a stand-in converter that writes files."""
    calls: list[Path] = []

    def fake_convert(gguf_path: Path, out_dir: Path) -> None:
        calls.append(out_dir)
        if gguf_path.read_bytes() == b"broken":
            raise RuntimeError("conversion failed")
        (out_dir / "model.safetensors").write_bytes(gguf_path.read_bytes())

    monkeypatch.setattr(weights, "convert_gguf", fake_convert)
    gguf, cache = tmp_path / "My-Model.Q4.gguf", tmp_path / "cache"
    gguf.write_bytes(b"v1")
    first = resolve_model_dir(str(gguf), cache)
    assert first == cache / "My-Model.Q4" and served_name(str(gguf)) == "My-Model.Q4"
    assert resolve_model_dir(str(gguf), cache) == first and len(calls) == 1  # cache hit

    gguf.write_bytes(b"v2 longer")  # another GGUF under the same name: converted again
    assert (resolve_model_dir(str(gguf), cache) / "model.safetensors").read_bytes() == b"v2 longer"
    assert len(calls) == 2

    marker = first / weights.SOURCE_MARKER
    marker.write_text(json.dumps({**json.loads(marker.read_text()), "format": 0}))  # older converter
    resolve_model_dir(str(gguf), cache)
    assert len(calls) == 3

    gguf.write_bytes(b"broken")
    with pytest.raises(RuntimeError):
        resolve_model_dir(str(gguf), cache)
    assert sorted(p.name for p in cache.iterdir()) == ["My-Model.Q4"]  # no temp dir left behind
    assert (first / "model.safetensors").read_bytes() == b"v2 longer"  # the old entry is untouched


@pytest.fixture(scope="module")
def bundled_dir() -> Path:
    return resolve_model_dir(BUNDLED_MODEL_ID, SHARED_CACHE)


@pytest.mark.slow
def test_second_resolve_is_a_cache_hit(bundled_dir: Path) -> None:
    marker = bundled_dir / weights.SOURCE_MARKER
    stamps = {p.name: p.stat().st_mtime_ns for p in bundled_dir.iterdir()}
    before = weights.conversions
    assert resolve_model_dir(BUNDLED_MODEL_ID, SHARED_CACHE) == bundled_dir
    assert weights.conversions == before
    assert {p.name: p.stat().st_mtime_ns for p in bundled_dir.iterdir()} == stamps
    assert json.loads(marker.read_text())["format"] == weights.CONVERSION_FORMAT
    assert not [p for p in SHARED_CACHE.iterdir() if p.name.startswith(".")]  # no temp dir left


@pytest.mark.slow
def test_converted_dir_equals_the_gguf_model(bundled_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = json.loads((bundled_dir / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    assert config["rope_theta"] == config["rope_parameters"]["rope_theta"]

    converted = AutoModelForCausalLM.from_pretrained(str(bundled_dir)).eval()
    assert converted.dtype == torch.float32
    gguf = weights.bundled_gguf_path()
    reference = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    ).eval()
    ref_state = reference.state_dict()
    for name, tensor in converted.state_dict().items():
        assert torch.equal(tensor, ref_state[name]), name

    tok = AutoTokenizer.from_pretrained(str(bundled_dir))
    assert tok.eos_token == "<|im_end|>"
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "Name three colours of the rainbow."}],
        add_generation_prompt=True, return_tensors="pt", return_dict=True,
    )["input_ids"]
    kw = dict(max_new_tokens=24, do_sample=False, pad_token_id=tok.eos_token_id)
    with torch.inference_mode():
        out_converted = converted.generate(ids, attention_mask=torch.ones_like(ids), **kw)
        out_reference = reference.generate(ids, attention_mask=torch.ones_like(ids), **kw)
    assert out_converted.shape[1] > ids.shape[1]
    assert out_converted.tolist() == out_reference.tolist()
