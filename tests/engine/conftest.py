"""Fixtures of the engine tests: tiny random-weight Llama checkpoints saved as Hugging Face
directories (safetensors + a byte-level tokenizer), so unit tests run in milliseconds."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

VOCAB = 260  # 256 byte tokens + specials (+ 1 unused)
EOS = 256
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map used by byte-level BPE."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs), strict=True))


def _save_byte_tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: b for b, ch in _bytes_to_unicode().items()}  # token id == byte value
    vocab.update({"<|endoftext|>": 256, "<|im_start|>": 257, "<|im_end|>": 258})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(path))


def build_tiny_llama(path: Path, *, seed: int = 0, **overrides) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        rms_norm_eps=1e-5, tie_word_embeddings=True, eos_token_id=EOS, bos_token_id=None,
        pad_token_id=None, initializer_range=0.2, rope_theta=10000.0,
    )
    cfg.update(overrides)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**cfg)).float().eval()
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(path), safe_serialization=True)
    _save_byte_tokenizer(path)
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """2 layers, hidden 64, 4 query / 2 KV heads, tied embeddings, default RoPE."""
    return build_tiny_llama(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def tiny_llama3_dir(tmp_path_factory) -> Path:
    """Untied embeddings, llama3 RoPE scaling, head_dim 32 with 4 heads of hidden 96."""
    return build_tiny_llama(
        tmp_path_factory.mktemp("tiny3") / "model", seed=1,
        hidden_size=96, num_attention_heads=4, num_key_value_heads=1, head_dim=32,
        tie_word_embeddings=False, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    )


def make_engine_config(model_dir: Path, **kw):
    """An ``EngineConfig`` for the tiny models: CPU, fp32, a small pool, small batches."""
    from engine.config import EngineConfig

    base = dict(model=str(model_dir), device="cpu", dtype="float32", num_blocks=64,
                max_num_batched_tokens=64, max_num_seqs=16, attention_backend="torch")
    base.update(kw)
    return EngineConfig(**base)


@pytest.fixture(scope="session")
def engine_config():
    """The ``make_engine_config`` factory (test modules cannot import conftest)."""
    return make_engine_config
