"""Dense peak throughput of the GPUs Transformer Engine supports (Ampere to Blackwell), per GEMM precision.

Every number is the datasheet's *dense* tensor-core figure in TFLOP/s: NVIDIA lists tensor-core rates
"with sparsity" (2:4 structured), and dense is half of that; ``fp32`` is the plain (non-tensor-core)
FP32 rate. Precisions: ``fp32`` (float32 matmuls, torch's default), ``tf32`` (float32 GEMMs on tensor
cores: TE runs every all-float32 GEMM as TF32, transformer_engine/common/gemm/cublaslt_gemm.cu
CUBLAS_COMPUTE_32F_FAST_TF32), ``bf16`` (and fp16), ``fp8`` (TE's FP8 recipes, MXFP8 included), ``fp4``
(NVFP4, Blackwell). A precision the GPU has no tensor-core path for is absent (A100 has no FP8).

Sources (read 2026-11; "sparse" figures halved):

- A100: "NVIDIA A100 Tensor Core GPU" datasheet (SXM and PCIe, 40 and 80 GB: FP32 19.5, TF32 156,
  BF16 312 dense).
- A30: "NVIDIA A30 Tensor Core GPU" datasheet (FP32 10.3, TF32 82, BF16 165).
- A10: "NVIDIA A10 Tensor Core GPU" datasheet (FP32 31.2, TF32 62.5, BF16 125).
- A40: "NVIDIA A40" datasheet (FP32 37.4, TF32 74.8, BF16 149.7).
- L4: "NVIDIA L4 Tensor Core GPU" datasheet (FP32 30.3; TF32 120, BF16 242, FP8 485 sparse).
- L40: "NVIDIA L40" datasheet (FP32 90.5; TF32 181, BF16 362.1, FP8 724 sparse).
- L40S: "NVIDIA L40S" datasheet (FP32 91.6; TF32 366, BF16 733, FP8 1,466 sparse).
- H100 SXM, H200 SXM, GH200: "NVIDIA H100 Tensor Core GPU", "NVIDIA H200 Tensor Core GPU" and
  "NVIDIA GH200 Grace Hopper Superchip" datasheets (FP32 67; TF32 989, BF16 1,979, FP8 3,958 sparse).
- H100 PCIe: H100 datasheet (FP32 51; TF32 756, BF16 1,513, FP8 3,026 sparse).
- H100 NVL, H200 NVL: H100 and H200 datasheets (FP32 60; TF32 835, BF16 1,671, FP8 3,341 sparse).
- H20: NVIDIA has published no datasheet; the figures NVIDIA's partners list (FP32 44, TF32 74,
  BF16 148, FP8 296 dense).
- B200: "NVIDIA HGX B200" / DGX B200 datasheets, per GPU (FP32 75; TF32 2.2, BF16 4.5, FP8 9, FP4 18
  PFLOPS sparse).
- B100: "NVIDIA Blackwell Architecture Technical Brief", HGX B100 per GPU (FP32 60; TF32 1.8, BF16
  3.5, FP8 7, FP4 14 PFLOPS sparse).
- GB200: "NVIDIA GB200 NVL72" datasheet, per Blackwell GPU (FP32 80; TF32 2.5, BF16 5, FP8 10, FP4 20
  PFLOPS sparse).
- GB300: "NVIDIA GB300 NVL72" datasheet, per Blackwell Ultra GPU (FP32 80; TF32 1.25, BF16 2.5, FP8 5,
  FP4 15 PFLOPS dense).

GeForce/RTX workstation cards are left out: their FP32-accumulate tensor rates (what TE's GEMMs use) are
not on their datasheets. Any GPU not matched here is reported as unknown, never guessed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

PRECISIONS = ("fp32", "tf32", "bf16", "fp8", "fp4")


@dataclass(frozen=True)
class GpuPeak:
    name: str
    """The table's name for the GPU (``H100 SXM``)."""
    pattern: str
    """A regular expression matched against ``torch.cuda.get_device_name()``."""
    tflops: dict[str, float]
    """Precision -> dense TFLOP/s."""
    source: str


def _p(fp32: float, tf32: float, bf16: float, fp8: float | None = None, fp4: float | None = None) -> dict:  # type: ignore[type-arg]
    peaks = {"fp32": fp32, "tf32": tf32, "bf16": bf16}
    if fp8 is not None:
        peaks["fp8"] = fp8
    if fp4 is not None:
        peaks["fp4"] = fp4
    return peaks


_H100_SXM = _p(67.0, 494.5, 989.5, 1979.0)
_H100_NVL = _p(60.0, 417.5, 835.5, 1670.5)

# Order matters: the first pattern that matches wins ("H100 PCIe" before "H100", "GB200" before "B200").
GPUS: tuple[GpuPeak, ...] = (
    GpuPeak("GB300", r"\bGB300\b", _p(80.0, 1250.0, 2500.0, 5000.0, 15000.0), "NVIDIA GB300 NVL72 datasheet"),
    GpuPeak("GB200", r"\bGB200\b", _p(80.0, 1250.0, 2500.0, 5000.0, 10000.0), "NVIDIA GB200 NVL72 datasheet"),
    GpuPeak("B200", r"\bB200\b", _p(75.0, 1100.0, 2250.0, 4500.0, 9000.0), "NVIDIA HGX B200 datasheet"),
    GpuPeak("B100", r"\bB100\b", _p(60.0, 900.0, 1750.0, 3500.0, 7000.0), "NVIDIA Blackwell technical brief"),
    GpuPeak("GH200", r"\bGH200\b", _H100_SXM, "NVIDIA GH200 Grace Hopper Superchip datasheet"),
    GpuPeak("H200 NVL", r"\bH200\b.*\bNVL\b", _H100_NVL, "NVIDIA H200 Tensor Core GPU datasheet"),
    GpuPeak("H200 SXM", r"\bH200\b", _H100_SXM, "NVIDIA H200 Tensor Core GPU datasheet"),
    GpuPeak("H100 NVL", r"\bH100\b.*\bNVL\b", _H100_NVL, "NVIDIA H100 Tensor Core GPU datasheet"),
    GpuPeak(
        "H100 PCIe",
        r"\bH100\b.*\bPCIe\b",
        _p(51.0, 378.0, 756.5, 1513.0),
        "NVIDIA H100 Tensor Core GPU datasheet",
    ),
    GpuPeak("H100 SXM", r"\bH100\b", _H100_SXM, "NVIDIA H100 Tensor Core GPU datasheet"),
    GpuPeak("H20", r"\bH20\b", _p(44.0, 74.0, 148.0, 296.0), "NVIDIA partners' H20 specifications"),
    GpuPeak("L40S", r"\bL40S\b", _p(91.6, 183.0, 366.5, 733.0), "NVIDIA L40S datasheet"),
    GpuPeak("L40", r"\bL40\b", _p(90.5, 90.5, 181.0, 362.0), "NVIDIA L40 datasheet"),
    GpuPeak("L4", r"\bL4\b", _p(30.3, 60.0, 121.0, 242.5), "NVIDIA L4 Tensor Core GPU datasheet"),
    GpuPeak("A100", r"\bA100\b", _p(19.5, 156.0, 312.0), "NVIDIA A100 Tensor Core GPU datasheet"),
    GpuPeak("A40", r"\bA40\b", _p(37.4, 74.8, 149.7), "NVIDIA A40 datasheet"),
    GpuPeak("A30", r"\bA30\b", _p(10.3, 82.0, 165.0), "NVIDIA A30 Tensor Core GPU datasheet"),
    GpuPeak("A10", r"\bA10\b", _p(31.2, 62.5, 125.0), "NVIDIA A10 Tensor Core GPU datasheet"),
)


def find_gpu(device_name: str) -> GpuPeak | None:
    """The table entry for a GPU by its CUDA device name (``NVIDIA H100 80GB HBM3``), or None."""
    for gpu in GPUS:
        if re.search(gpu.pattern, device_name, flags=re.IGNORECASE):
            return gpu
    return None


_QUANTIZED = {
    "DelayedScaling": "fp8",
    "Float8CurrentScaling": "fp8",
    "Float8BlockScaling": "fp8",
    "MXFP8BlockScaling": "fp8",
    "NVFP4BlockScaling": "fp4",
}


def gemm_precision(dtype: torch.dtype, *, te_gemms: bool, recipe_kind: str | None = None) -> str | None:
    """The precision the GEMMs run in: the recipe's format when TE's kernels quantize
    (``te_gemms``: engine=te with TE's kernels), else the dtype's, where float32 is TF32 in TE's GEMMs
    or when torch allows TF32 matmuls. None for a dtype with no entry (float64)."""
    if te_gemms and recipe_kind in _QUANTIZED:
        return _QUANTIZED[recipe_kind]
    if dtype in (torch.bfloat16, torch.float16):
        return "bf16"
    if dtype == torch.float32:
        tf32 = te_gemms or torch.get_float32_matmul_precision() != "highest"
        return "tf32" if tf32 else "fp32"
    return None


@dataclass(frozen=True)
class Peak:
    """What ``bench`` compares against: the GPU, the precision and its peak (None: the reason)."""

    device: str
    precision: str | None
    gpu: GpuPeak | None
    tflops: float | None
    why_none: str = ""

    def describe(self) -> str:
        if self.tflops is not None and self.gpu is not None and self.precision is not None:
            return (
                f"peak: {self.gpu.name}, {self.precision.upper()} dense {self.tflops:g} TFLOP/s "
                f"({self.gpu.source}; te_assembly/jobs/bench/peaks.py)"
            )
        return f"% of peak: n/a ({self.why_none})"


def peak_for(device: torch.device, precision: str | None) -> Peak:
    """The dense peak of ``device`` at ``precision``, or why there is none (CPU, an unknown GPU, a
    precision the GPU has no tensor-core path for)."""
    if device.type != "cuda":
        return Peak("CPU", precision, None, None, "no peak table for CPUs")
    name = torch.cuda.get_device_name(device)
    gpu = find_gpu(name)
    if gpu is None:
        return Peak(name, precision, None, None, f"unknown GPU {name!r}: no datasheet entry")
    if precision is None or precision not in gpu.tflops:
        return Peak(name, precision, gpu, None, f"{gpu.name} has no {precision or 'such'} peak in the table")
    return Peak(name, precision, gpu, gpu.tflops[precision])


def peak_tflops(device: torch.device, dtype: torch.dtype, tf32: bool = False) -> float | None:
    """The device's dense peak for ``dtype`` (``tf32``: float32 GEMMs run as TF32, TE's kernels), or
    None (CPU, an unknown GPU or dtype)."""
    return peak_for(device, gemm_precision(dtype, te_gemms=tf32)).tflops


__all__ = ["GPUS", "PRECISIONS", "GpuPeak", "Peak", "find_gpu", "gemm_precision", "peak_for", "peak_tflops"]
