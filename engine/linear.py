"""Dense layers ``y = x W^T + b`` through the fastest GEMM this machine has.

On x86 CPUs torch's ``F.linear`` calls MKL, which runs 2-3x below oneDNN on AMD EPYC (measured
on the 2-core Zen 5 build machine: a 64x576 @ 576x3072 product takes 1.30 ms in MKL and
0.54 ms in oneDNN with the weight prepacked; the 49152-row ``lm_head`` 28 ms vs 9 ms). So on CPU
each weight is reordered once into oneDNN's blocked layout and every call goes through
``mkldnn._linear_pointwise``; anywhere else (CUDA, builds without oneDNN, ``backend="torch"``)
it is plain ``F.linear``. Both give the same product up to float summation order.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_PACK_BATCH_HINT = 64  # oneDNN picks its blocking for this many rows; any row count works
_ONEDNN_OK: dict[torch.dtype, bool] = {}  # probed once per dtype by onednn_available()


def onednn_available(dtype: torch.dtype = torch.float32) -> bool:
    """True when torch's oneDNN prepacked linear runs here for ``dtype`` (probed once on a tiny
    product). bf16 needs AVX-512 (BW/VL/DQ) or AVX-NE-CONVERT: an AVX2-only CPU has fp32 only."""
    ok = _ONEDNN_OK.get(dtype)
    if ok is None:
        try:
            w = torch.ops.mkldnn._reorder_linear_weight(torch.ones(2, 2, dtype=dtype), 1)
            y = torch.ops.mkldnn._linear_pointwise(torch.ones(1, 2, dtype=dtype), w, None, "none", [], "")
            ok = bool(torch.backends.mkldnn.is_available()) and y.float().tolist() == [[2.0, 2.0]]
        except (AttributeError, RuntimeError):
            ok = False
        _ONEDNN_OK[dtype] = ok
    return ok


def resolve_linear_backend(name: str, device: torch.device, dtype: torch.dtype) -> str:
    """``auto`` -> ``onednn`` on CPU for fp32/bf16 when oneDNN runs that dtype here, else ``torch``."""
    if name not in ("auto", "onednn", "torch"):
        raise ValueError("linear backend must be auto, onednn or torch")
    usable = device.type == "cpu" and dtype in (torch.float32, torch.bfloat16) and onednn_available(dtype)
    if name == "onednn" and not usable:
        raise ValueError(f"the onednn linear backend needs a CPU torch build with oneDNN for {dtype} on this CPU "
                         "(fp32; bf16 also needs AVX-512 or AVX-NE-CONVERT)")
    if name == "auto":
        return "onednn" if usable else "torch"
    return name


class Linear:
    """One dense layer. Holds only the packed weight on the oneDNN path (no second copy).

    ``act_dtype`` (e.g. fp32 activations over bf16 weights): inputs are cast to the weight's
    dtype for the product and the result back to ``act_dtype``."""

    __slots__ = ("weight", "bias", "out_features", "_packed", "_act_dtype", "_w_dtype")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, *, backend: str = "torch",
                 act_dtype: torch.dtype | None = None) -> None:
        self.out_features = weight.shape[0]
        self.bias = bias
        self._packed = backend == "onednn"
        self._w_dtype = weight.dtype
        self._act_dtype = act_dtype if act_dtype != weight.dtype else None
        self.weight = (
            torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), _PACK_BATCH_HINT) if self._packed else weight
        )

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self._act_dtype is not None:
            return self._product(x.to(self._w_dtype)).to(self._act_dtype)
        return self._product(x)

    def _product(self, x: torch.Tensor) -> torch.Tensor:
        if self._packed:
            if x.dim() != 2:
                lead = x.shape[:-1]
                return self._product(x.reshape(-1, x.shape[-1])).view(*lead, self.out_features)
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)
