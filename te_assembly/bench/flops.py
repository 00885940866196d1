"""FLOPs of a plan's matrix multiplies and the peak dense throughput of known GPUs.

Only GEMMs are counted (2 * rows * in * out per linear; a grouped linear by the rows it receives,
summed over groups; the router's scoring GEMM); element-wise ops are left out. Backward is counted as
twice the forward (data gradient + weight gradient), a full step as three times.
"""

from __future__ import annotations

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


def forward_flops(plan: Plan, tokens: int) -> int:
    rows = rows_per_step(plan, tokens)
    total = 0
    for step in plan.steps:
        a, n = step.args, rows[step.index]
        if step.type in ("Linear", "BasicLinear", "GroupedLinear"):
            total += 2 * n * int(a["in_features"]) * int(a["out_features"])
        elif step.kind == "op" and step.type == "TopKRouter":
            total += 2 * n * int(a["in_features"]) * int(a["num_experts"])
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
