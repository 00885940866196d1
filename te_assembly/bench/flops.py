"""FLOPs of a plan's matrix multiplies and the peak dense throughput of known GPUs.

Only GEMMs are counted (2 * rows * in * out per linear; a grouped linear by the rows it receives,
summed over groups; the router's scoring GEMM; attention's two batched GEMMs, q k^T and p v, 2 * 2 *
head_dim multiply-adds per head per (query, key) pair it computes: every pair, or the s (s + 1) / 2 of
each sequence when causal, as FlashAttention's benchmarks count); element-wise ops are left out.
Backward is counted as twice the forward (data gradient + weight gradient), a full step as three times.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from te_assembly.engines.data import rows_per_step
from te_assembly.plan import Plan

# Dense (no sparsity) tensor-core peaks in TFLOP/s, from NVIDIA's datasheets: "NVIDIA H100 Tensor Core
# GPU" (SXM5: BF16/FP16 1,979 and TF32 989 with sparsity, FP32 67; PCIe: BF16 1,513 and TF32 756
# sparse, FP32 51) and "NVIDIA H200 Tensor Core GPU" (SXM: BF16 1,979 and TF32 989 sparse, FP32 67).
# Dense = sparse / 2. float32 counts as plain FP32 for torch's own matmuls (torch leaves TF32 off by
# default) and as TF32 for TE's GEMMs (``tf32=True``): TE runs every all-float32 GEMM as TF32
# (transformer_engine/common/gemm/cublaslt_gemm.cu, CUBLAS_COMPUTE_32F_FAST_TF32).
_PEAKS: tuple[tuple[str, dict[torch.dtype, float], float], ...] = (
    ("H200", {torch.bfloat16: 989.5, torch.float16: 989.5, torch.float32: 67.0}, 494.5),
    ("H100 PCIe", {torch.bfloat16: 756.5, torch.float16: 756.5, torch.float32: 51.0}, 378.0),
    ("H100", {torch.bfloat16: 989.5, torch.float16: 989.5, torch.float32: 67.0}, 494.5),
)
PEAK_SOURCE = "NVIDIA H100/H200 Tensor Core GPU datasheets, dense (sparsity figures / 2)"


def attention_flops(args: Mapping[str, Any], rows: int, seq_len: int) -> int:
    """Forward FLOPs of an ``Attention`` step on ``rows`` rows in sequences of ``seq_len``."""
    sequences = rows // seq_len
    pairs = seq_len * (seq_len + 1) // 2 if args.get("causal", True) else seq_len * seq_len
    return 4 * sequences * int(args["num_heads"]) * int(args["head_dim"]) * pairs


def forward_flops(plan: Plan, tokens: int, seq_len: int | None = None) -> int:
    """Forward GEMM FLOPs of one call on ``tokens`` rows (in sequences of ``seq_len`` for attention;
    default: one sequence)."""
    rows = rows_per_step(plan, tokens)
    total = 0
    for step in plan.steps:
        a, n = step.args, rows[step.index]
        if step.type in ("Linear", "BasicLinear", "GroupedLinear"):
            total += 2 * n * int(a["in_features"]) * int(a["out_features"])
        elif step.kind == "op" and step.type == "TopKRouter":
            total += 2 * n * int(a["in_features"]) * int(a["num_experts"])
        elif step.kind == "module" and step.type == "Attention" and n:
            total += attention_flops(a, n, min(seq_len or n, n))
    return total


def peak_tflops(device: torch.device, dtype: torch.dtype, tf32: bool = False) -> float | None:
    """The device's dense peak for ``dtype``, or None (CPU, unknown GPU or dtype). ``tf32``: float32
    GEMMs run as TF32 (TE's kernels)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for marker, peaks, tf32_peak in _PEAKS:
        if marker in name:
            return tf32_peak if tf32 and dtype == torch.float32 else peaks.get(dtype)
    return None
