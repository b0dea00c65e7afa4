"""The native CPU decode kernel (``kernels/csrc/cpu_attention.c`` through ``kernels.native``)
against the reference: decodes and mixed batches, GQA and MHA, block sizes 8-64, head dims
64/128, contexts from 1 token to 1,500, fp32 and bf16 caches, shared prefix blocks."""

from __future__ import annotations

import shutil

import pytest
import torch

import kernels
from kernels import native
from kernels.reference import paged_attention_ref

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("cc") is None,
                                reason="no C compiler: the native kernel falls back to torch")

# (cache dtype, q heads, kv heads, head_dim, block_size, q_lens, seq_lens)
CASES = {
    "decode-gqa3": (torch.float32, 9, 3, 64, 16, [1, 1, 1, 1], [1, 17, 150, 33]),
    "decode-mha-bs8": (torch.float32, 4, 4, 32, 8, [1, 1, 1], [8, 9, 64]),
    "decode-gqa8-d128-bs64": (torch.float32, 8, 1, 128, 64, [1, 1], [65, 300]),
    "decode-long-context": (torch.float32, 9, 3, 64, 16, [1, 1], [1500, 777]),
    "mixed-gqa3-prefix-chunks": (torch.float32, 9, 3, 64, 16, [1, 7, 1, 21, 5], [37, 7, 16, 50, 83]),
    "mixed-zero-len-bs32": (torch.float32, 8, 2, 64, 32, [3, 0, 1, 40], [45, 12, 1, 70]),
    "bf16-decode": (torch.bfloat16, 8, 2, 64, 16, [1, 1, 1], [19, 33, 260]),
}
ATOL = {torch.float32: 2e-5, torch.bfloat16: 3e-2}


def _cpu(b):
    b.query, b.key_cache, b.value_cache = b.query.cpu(), b.key_cache.cpu(), b.value_cache.cpu()
    for name in ("query_start_loc", "seq_lens", "block_tables"):
        setattr(b, name, getattr(b, name).cpu())
    return b


def test_the_kernel_builds_here():
    assert native.available(), "gcc is on PATH, so the native kernel must build"
    assert kernels.resolve_backend("auto", torch.device("cpu")) == "native"


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_native_equals_reference(case, paged_batch):
    dtype, hq, hkv, d, bs, q_lens, seq_lens = case
    b = _cpu(paged_batch(q_lens=q_lens, seq_lens=seq_lens, num_q_heads=hq, num_kv_heads=hkv,
                              head_dim=d, block_size=bs, dtype=dtype))
    expected = paged_attention_ref(b.query, b.key_cache, b.value_cache, **b.kwargs())
    got = kernels.paged_attention(b.query, b.key_cache, b.value_cache, **b.kwargs(),
                                  max_query_len=max(q_lens), max_seq_len=max(seq_lens), backend="native")
    assert got.dtype == dtype and got.shape == expected.shape
    torch.testing.assert_close(got.float(), expected.float(), atol=ATOL[dtype], rtol=1e-4)


def test_decode_over_shared_prefix_blocks_and_large_scores():
    """Sequences whose tables start with the same blocks (a shared system prompt), with scores
    spread wide enough that the online softmax's rescaling matters."""
    torch.manual_seed(0)
    nb, bs, hkv, d, hq = 40, 16, 3, 64, 9
    kc = torch.randn(nb, bs, hkv, d) * 4
    vc = torch.randn(nb, bs, hkv, d)
    shared = torch.tensor([5, 9, 2, 30], dtype=torch.int32)
    tables = torch.stack([torch.cat([shared, torch.randperm(nb)[:6].int()]) for _ in range(6)])
    lens = torch.tensor([64, 65, 80, 100, 159, 160], dtype=torch.int32)
    q = torch.randn(6, hq, d) * 4
    qsl = torch.arange(7, dtype=torch.int32)
    expected = paged_attention_ref(q, kc, vc, query_start_loc=qsl, seq_lens=lens, block_tables=tables, scale=d ** -0.5)
    got = native.paged_decode(q, kc, vc, lens, tables, d ** -0.5)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


def test_non_contiguous_query_rows(paged_batch):
    """The engine's queries are views of the fused QKV output: a token stride wider than Hq*D."""
    b = _cpu(paged_batch(q_lens=[1, 1, 1], seq_lens=[5, 40, 90], num_q_heads=4, num_kv_heads=2,
                              head_dim=64, block_size=16, dtype=torch.float32))
    wide = torch.randn(3, 4 * 64 + 128)
    q = wide[:, : 4 * 64].view(3, 4, 64)
    assert not q.is_contiguous()
    expected = paged_attention_ref(q.contiguous(), b.key_cache, b.value_cache, **b.kwargs())
    got = native.paged_decode(q, b.key_cache, b.value_cache, b.seq_lens, b.block_tables, b.scale)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


def test_unsupported_shapes_fall_back_to_torch(paged_batch):
    b = _cpu(paged_batch(q_lens=[1, 1], seq_lens=[10, 30], num_q_heads=80, num_kv_heads=80,
                              head_dim=16, block_size=16, dtype=torch.float32))
    assert not native.supports(b.query, b.key_cache)  # more than 64 query heads
    expected = paged_attention_ref(b.query, b.key_cache, b.value_cache, **b.kwargs())
    got = kernels.paged_attention(b.query, b.key_cache, b.value_cache, **b.kwargs(), backend="native")
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


def test_build_is_cached_per_source_and_written_atomically(tmp_path, monkeypatch):
    monkeypatch.setenv("PAGEGATE_KERNEL_CACHE", str(tmp_path))
    lib = native._build()
    built = list(tmp_path.glob("pagegate_cpu-*.so"))
    assert len(built) == 1 and lib is not None
    mtime = built[0].stat().st_mtime_ns
    native._build()  # a second build finds the cached file
    assert [p.stat().st_mtime_ns for p in tmp_path.glob("*.so")] == [mtime]
    assert not list(tmp_path.glob("tmp*"))  # no half-written temporaries left behind


# ---- the fused fp32 layers ---------------------------------------------------------------
def test_rms_norm_and_add_rms_norm_equal_torch():
    torch.manual_seed(0)
    x, res, w = torch.randn(37, 96) * 3, torch.randn(37, 96), torch.randn(96)
    torch.testing.assert_close(native.rms_norm(x, w, 1e-5), torch.nn.functional.rms_norm(x, (96,), w, 1e-5))
    expected_res = res + x
    expected = torch.nn.functional.rms_norm(expected_res, (96,), w, 1e-5)
    got = native.add_rms_norm(x, res, w, 1e-5)
    torch.testing.assert_close(res, expected_res)  # updated in place
    torch.testing.assert_close(got, expected)


def test_silu_mul_equals_torch_over_a_wide_range():
    torch.manual_seed(0)
    gu = torch.randn(20, 2 * 160) * 30  # exercises exp far out in both directions
    gate, up = gu.chunk(2, dim=-1)
    torch.testing.assert_close(native.silu_mul(gu), torch.nn.functional.silu(gate) * up, atol=1e-5, rtol=1e-5)


def test_rope_and_write_kv_equals_rotary_then_cache_write():
    from engine.rotary import RotaryEmbedding
    from kernels.torch_ops import write_kv_cache_torch

    torch.manual_seed(0)
    hq, hkv, d, t = 9, 3, 64, 11
    rope = RotaryEmbedding(d, 2048, 10000.0, None, torch.float32, torch.device("cpu"))
    wide = torch.randn(t, (hq + 2 * hkv) * d + 32)  # a row stride wider than QKV, like a view
    qkv = wide[:, : (hq + 2 * hkv) * d]
    positions = torch.tensor([0, 1, 5, 17, 100, 101, 102, 999, 1500, 3, 2047])
    slots = torch.tensor([4, 9, -1, 0, 31, 30, 2, 7, 8, 12, 15])
    kc, vc = torch.zeros(4, 8, hkv, d), torch.zeros(4, 8, hkv, d)
    q = native.rope_and_write_kv(qkv, positions, rope.cos, rope.sin, kc, vc, slots, hq, hkv, d)

    q_ref, k_ref, v_ref = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    q_ref, k_ref = rope.apply(rope.tables(positions), q_ref.reshape(t, hq, d), k_ref.reshape(t, hkv, d))
    kc_ref, vc_ref = torch.zeros_like(kc), torch.zeros_like(vc)
    write_kv_cache_torch(k_ref, v_ref.reshape(t, hkv, d), kc_ref, vc_ref, slots)
    torch.testing.assert_close(q, q_ref)
    torch.testing.assert_close(kc, kc_ref)  # slot -1 wrote nothing
    torch.testing.assert_close(vc, vc_ref)


def test_rope_and_write_kv_into_a_bf16_cache_rounds_to_nearest():
    from engine.rotary import RotaryEmbedding

    torch.manual_seed(1)
    hq, hkv, d, t = 4, 2, 64, 5
    rope = RotaryEmbedding(d, 64, 10000.0, None, torch.float32, torch.device("cpu"))
    qkv = torch.randn(t, (hq + 2 * hkv) * d)
    positions, slots = torch.arange(t), torch.tensor([3, 0, 1, 7, 2])
    kc, vc = torch.zeros(2, 4, hkv, d, dtype=torch.bfloat16), torch.zeros(2, 4, hkv, d, dtype=torch.bfloat16)
    native.rope_and_write_kv(qkv, positions, rope.cos, rope.sin, kc, vc, slots, hq, hkv, d)
    kf, vf = torch.zeros(2, 4, hkv, d), torch.zeros(2, 4, hkv, d)
    native.rope_and_write_kv(qkv, positions, rope.cos, rope.sin, kf, vf, slots, hq, hkv, d)
    assert torch.equal(kc, kf.bfloat16()) and torch.equal(vc, vf.bfloat16())  # torch also rounds to nearest even


def test_without_a_compiler_auto_falls_back_to_torch(monkeypatch, tmp_path):
    monkeypatch.setattr(native, "_LIB", None)
    monkeypatch.setattr(native, "_FAILED", False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no gcc, no cc
    monkeypatch.setenv("PAGEGATE_KERNEL_CACHE", str(tmp_path / "cache"))
    assert native.library() is None and not native.available()
    assert kernels.resolve_backend("auto", torch.device("cpu")) == "torch"
    assert not native.layers_supported(torch.float32, torch.device("cpu"))


def test_fused_layers_take_views_and_int32_indices():
    """Views and int32 positions/slots are normalised, never read as raw memory of another layout."""
    from engine.rotary import RotaryEmbedding

    torch.manual_seed(2)
    wide = torch.randn(6, 200)
    x, w = wide[:, :96], torch.randn(96)  # a row stride of 200
    torch.testing.assert_close(native.rms_norm(x, w, 1e-5), torch.nn.functional.rms_norm(x, (96,), w, 1e-5))
    gu = torch.randn(40, 6).t()  # [6, 40], transposed
    torch.testing.assert_close(native.silu_mul(gu), torch.nn.functional.silu(gu[:, :20]) * gu[:, 20:])
    with pytest.raises(ValueError):
        native.add_rms_norm(torch.randn(6, 96), torch.randn(96, 6).t(), w, 1e-5)

    hq, hkv, d = 2, 1, 64
    rope = RotaryEmbedding(d, 64, 10000.0, None, torch.float32, torch.device("cpu"))
    qkv = torch.randn(3, (hq + 2 * hkv) * d)
    kc32, vc32 = torch.zeros(1, 8, hkv, d), torch.zeros(1, 8, hkv, d)
    kc64, vc64 = torch.zeros(1, 8, hkv, d), torch.zeros(1, 8, hkv, d)
    pos, slots = torch.tensor([1, 5, 9]), torch.tensor([0, 3, 7])
    q32 = native.rope_and_write_kv(qkv, pos.int(), rope.cos, rope.sin, kc32, vc32, slots.int(), hq, hkv, d)
    q64 = native.rope_and_write_kv(qkv, pos, rope.cos, rope.sin, kc64, vc64, slots, hq, hkv, d)
    assert torch.equal(q32, q64) and torch.equal(kc32, kc64) and torch.equal(vc32, vc64)
