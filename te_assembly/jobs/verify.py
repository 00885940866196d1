"""Compare the TE engine against the reference engine: same weights, same inputs, same cotangents.

``verify`` returns a ``VerifyReport`` (data); the ``verify`` command prints it. Compared: the main
output, every public extra output, the gradient of ``x`` and of every public float input, and every
parameter gradient, for the loss ``sum(output * fixed random cotangent)`` over the float outputs.

Both models run in eval mode: dropout masks come from each implementation's own RNG (TE's GPU dropout
has its own generator), so training-mode randomness is not comparable across engines.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from te_assembly.analysis.plan import Plan
from te_assembly.analysis.recipes import checked_recipe
from te_assembly.analysis.settings import RunSettings
from te_assembly.engines.base import AssembledModel
from te_assembly.engines.data import DEFAULT_SEQ_LEN
from te_assembly.engines.target import NO_RECIPE, Target, as_target
from te_assembly.engines.weights import copy_weights
from te_assembly.jobs.events import Built, OnEvent, ignore


@dataclass(frozen=True)
class Tolerance:
    """A tensor passes when ``max |te - ref| <= atol + rtol * max |ref|``: error measured against the
    tensor's scale, so near-zero elements of a quantized result do not fail on their own."""

    atol: float
    rtol: float


TOLERANCES: dict[str, Tolerance] = {
    "float64": Tolerance(atol=1e-12, rtol=1e-10),
    # float32 on both sides (CPU, or kernels=reference on a GPU): only summation order differs.
    "float32": Tolerance(atol=1e-6, rtol=1e-5),
    # float32 through TE's kernels on a GPU: TE runs every all-float32 GEMM as TF32
    # (transformer_engine/common/gemm/cublaslt_gemm.cu: CUBLAS_COMPUTE_32F_FAST_TF32), 10 mantissa bits.
    # TE's own tests hold one TF32 GEMM to float16 tolerances, rtol 1e-3 + atol 1e-5 per element
    # (tests/pytorch/test_fusible_ops.py: "tols = dtype_tols(torch.float16)  # TF32 GEMM"). A block
    # chains GEMMs forward and backward: bench/tf32_error.py emulates TF32 operands on CPU and measured
    # at most 6.5e-4 (round to nearest) and 2.5e-3 (truncation) of max|ref| on residual_mlp and
    # moe_block over 5 seeds; 5e-3 keeps twice the worst case.
    "tf32": Tolerance(atol=1e-5, rtol=5e-3),
    # TE's tests: rtol 1.6e-2 for bfloat16 (tests/pytorch/utils.py, dtype_tols); 8 mantissa bits.
    "bfloat16": Tolerance(atol=1e-3, rtol=2e-2),
    # FP8 keeps 3 mantissa bits (E4M3) forward and 2 (E5M2) for HYBRID gradients; TE's tests allow
    # rtol 0.125 for E4M3 and 0.25 for E5M2 per element (dtype_tols).
    "fp8": Tolerance(atol=1e-2, rtol=1.5e-1),
    # NVFP4 (E2M1) keeps 1 mantissa bit (TE's tests: rtol 0.25, atol 0.125 per element); block scales
    # and random Hadamard transforms recover some of it.
    "fp4": Tolerance(atol=2e-2, rtol=3e-1),
}
"""Precision class -> tolerance. The one place verify's thresholds live (the GPU sanity check reads
them too)."""

_RECIPE_PRECISION = {
    "DelayedScaling": "fp8",
    "Float8CurrentScaling": "fp8",
    "Float8BlockScaling": "fp8",
    "MXFP8BlockScaling": "fp8",
    "NVFP4BlockScaling": "fp4",
}


def precision_class(
    dtype: torch.dtype, recipe: Mapping[str, Any] | None = None, *, te_gemms: bool = False
) -> str:
    """The ``TOLERANCES`` key for a run: the recipe's format when it quantizes, else the dtype, where
    float32 through TE's GEMM kernels (``te_gemms``: kernels=te on a GPU) is TF32."""
    kind = (recipe or {}).get("kind", "none")
    if kind in _RECIPE_PRECISION:
        return _RECIPE_PRECISION[str(kind)]
    if dtype == torch.float32 and te_gemms:
        return "tf32"
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class TensorComparison:
    name: str
    """``y`` (the main output), a public output name, ``grad x``, ``grad <public input>`` or
    ``grad <parameter name>``."""
    kind: str
    """``main output``, ``output`` (a public extra output), ``input grad`` or ``param grad``."""
    shape: tuple[int, ...]
    max_abs: float
    max_rel: float
    """``max_abs / max |ref|`` (0 when both are all zero)."""
    passed: bool
    exact: bool = False
    """Integer tensors must be equal, with no tolerance."""
    note: str = ""


@dataclass(frozen=True)
class VerifyReport:
    model: str
    kernels: str
    device: str
    dtype: str
    recipe: str | None
    precision: str
    tolerance: Tolerance
    tokens: int
    seed: int
    comparisons: list[TensorComparison] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.comparisons)

    @property
    def failures(self) -> list[TensorComparison]:
        return [c for c in self.comparisons if not c.passed]


def state_dict_parameters(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """Parameters by their state-dict name. TE's ``ops.Linear`` also registers its basic ops' weight
    and bias under ``weight``/``bias`` (left out of its state dict), which ``named_parameters`` would
    report instead of ``basic_ops.0.weight``."""
    keys = set(model.state_dict(keep_vars=True))
    return {n: p for n, p in model.named_parameters(remove_duplicate=False) if n in keys}


def fill_constant_parameters(model: torch.nn.Module, seed: int, scale: float = 0.1) -> None:
    """Give every constant parameter (TE's zero biases, its norms' all-one scales) small random offsets,
    so a bias or a norm scale that one engine drops or misplaces changes the output instead of hiding
    behind zeros and ones."""
    generator = torch.Generator().manual_seed(seed + 2)
    with torch.no_grad():
        for p in model.parameters():
            flat = p.detach().reshape(-1)
            if p.is_floating_point() and flat.numel() and bool((flat == flat[0]).all()):
                noise = torch.randn(p.shape, generator=generator, dtype=torch.float64) * scale
                p.add_(noise.to(device=p.device, dtype=p.dtype))


MAIN_OUTPUT = "y"
"""The report's name for the main output. It is kept apart from the public outputs (which are keyed by
channel name), so no channel can stand in for it."""


@dataclass
class _Run:
    y: torch.Tensor
    outputs: dict[str, torch.Tensor]
    """Public extra outputs by name."""
    input_grads: dict[str, torch.Tensor | None]
    param_grads: dict[str, torch.Tensor | None]


@dataclass(frozen=True)
class _Cotangents:
    y: torch.Tensor
    extras: dict[str, torch.Tensor]


def _loss_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def _forward_backward(
    model: AssembledModel,
    x: torch.Tensor,
    inputs: Mapping[str, torch.Tensor],
    cotangents: _Cotangents | None,
    seed: int,
) -> tuple[_Run, _Cotangents]:
    xx = x.detach().clone().requires_grad_(x.is_floating_point())  # token ids have no gradient
    ins = {k: v.detach().clone().requires_grad_(v.is_floating_point()) for k, v in inputs.items()}
    model.zero_grad(set_to_none=True)
    y, extras = model(xx, **ins)
    if cotangents is None:
        cotangents = _cotangents(y, extras, seed)
    loss = (y.to(_loss_dtype(y.dtype)) * cotangents.y).sum() + sum(
        (
            (value.to(_loss_dtype(value.dtype)) * cotangents.extras[name]).sum()
            for name, value in extras.items()
            if name in cotangents.extras
        ),
        start=torch.zeros((), device=y.device),
    )
    loss.backward()
    run = _Run(
        y=y.detach(),
        outputs={k: v.detach() for k, v in extras.items()},
        input_grads={
            **({"x": xx.grad} if xx.is_floating_point() else {}),
            **{k: v.grad for k, v in ins.items() if v.is_floating_point()},
        },
        param_grads={name: p.grad for name, p in state_dict_parameters(model).items()},
    )
    return run, cotangents


def _cotangents(y: torch.Tensor, extras: Mapping[str, torch.Tensor], seed: int) -> _Cotangents:
    """One fixed random cotangent per float output, drawn on the CPU so every device sees the same."""
    generator = torch.Generator().manual_seed(seed + 1)

    def draw(value: torch.Tensor) -> torch.Tensor:
        noise = torch.randn(value.shape, generator=generator, dtype=torch.float64)
        return noise.to(device=value.device, dtype=_loss_dtype(value.dtype))

    main = draw(y)
    return _Cotangents(main, {name: draw(v) for name, v in extras.items() if v.is_floating_point()})


def compare(
    name: str, kind: str, candidate: torch.Tensor | None, reference: torch.Tensor | None, tolerance: Tolerance
) -> TensorComparison:
    """One row of the report. A missing gradient counts as zero (autograd leaves unused ones None)."""
    if candidate is None and reference is None:
        return TensorComparison(name, kind, (), 0.0, 0.0, True, note="no gradient in either engine")
    if candidate is None or reference is None:
        assert candidate is not None or reference is not None
        present = candidate if candidate is not None else reference
        assert present is not None
        candidate = candidate if candidate is not None else torch.zeros_like(present)
        reference = reference if reference is not None else torch.zeros_like(present)
    shape = tuple(reference.shape)
    if candidate.shape != reference.shape:
        note = f"shape {tuple(candidate.shape)} vs reference {shape}"
        return TensorComparison(name, kind, shape, float("inf"), float("inf"), False, note=note)
    exact = not (candidate.is_floating_point() or reference.is_floating_point())
    diff = (candidate.double() - reference.double()).abs()
    max_abs = diff.max().item() if diff.numel() else 0.0
    scale = reference.double().abs().max().item() if reference.numel() else 0.0
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf"))
    if exact:
        passed = bool(torch.equal(candidate.cpu(), reference.cpu()))
    else:
        passed = max_abs <= tolerance.atol + tolerance.rtol * scale  # False for NaN
    return TensorComparison(name, kind, shape, max_abs, max_rel, passed, exact=exact)


def _plan_of(config: Plan | Mapping[str, Any] | str) -> Plan:
    if isinstance(config, Plan):
        return config
    from te_assembly.analysis.pipeline import load

    return load(config).checked_plan()


def verify(
    config: Plan | Mapping[str, Any] | str,
    target: Target | str = "te",
    settings: RunSettings | None = None,
    *,
    on_event: OnEvent = ignore,
) -> VerifyReport:
    """Build both engines with the reference engine's weights, run one forward and backward on the same
    synthetic data and cotangents, and compare every output and gradient. Both models run in eval mode
    (dropout is the identity): random masks are not comparable across implementations.

    ``target``: where and how the TE engine (the candidate) runs, its kernels, recipe and seed (its
    engine is taken to be ``te``; the reference engine runs on the same device and dtype). ``settings``:
    the batch (``tokens``, ``seq_len``; default 64 rows)."""
    plan = _plan_of(config)
    target = dataclasses.replace(as_target(target), engine="te", parallel=None)
    settings = settings if settings is not None else RunSettings(tokens=64)
    tokens, seq_len, seed = settings.tokens, settings.seq_len, target.seed
    target.check_fits(
        plan,
        f"verifying {plan.name}",
        "lower run.tokens or make the model smaller",
        tokens=tokens,
        models=2,
        trained=2,
        seq_len=seq_len,
        fused=False,
    )
    # The TE engine is built first: it fails fastest (TE missing, kernels needing a GPU, recipe).
    candidate = target.build(plan)
    on_event(Built(candidate))
    reference = target.build(plan, seed=seed, engine="reference")
    fill_constant_parameters(reference, seed)
    copy_weights(reference, candidate)
    # Dropout draws its masks from each implementation's own RNG: compare the deterministic model.
    reference.eval()
    candidate.eval()

    x, inputs = target.sample(plan, tokens, torch.Generator().manual_seed(seed), seq_len)
    ref_run, cotangents = _forward_backward(reference, x, inputs, None, seed)
    te_run, _ = _forward_backward(candidate, x, inputs, cotangents, seed)

    precision = precision_class(target.dtype, target.recipe, te_gemms=target.te_gemms)
    tolerance = TOLERANCES[precision]
    return VerifyReport(
        model=plan.name,
        kernels=target.kernels,
        device=str(target.device),
        dtype=target.dtype_name,
        recipe=None if target.recipe is NO_RECIPE else target.recipe.name,
        precision=precision,
        tolerance=tolerance,
        tokens=tokens,
        seed=seed,
        comparisons=_rows(te_run, ref_run, tolerance),
    )


def _rows(te_run: _Run, ref_run: _Run, tolerance: Tolerance) -> list[TensorComparison]:
    rows = [compare(MAIN_OUTPUT, "main output", te_run.y, ref_run.y, tolerance)]
    rows += [compare(n, "output", te_run.outputs.get(n), v, tolerance) for n, v in ref_run.outputs.items()]
    rows += [
        compare(f"grad {n}", "input grad", te_run.input_grads.get(n), v, tolerance)
        for n, v in ref_run.input_grads.items()
    ]
    rows += [
        compare(f"grad {n}", "param grad", te_run.param_grads.get(n), v, tolerance)
        for n, v in ref_run.param_grads.items()
    ]
    return rows


ACTIVE_FACTOR = 4.0
"""A recipe counts as active when it moves TE's output off TE's bfloat16 output by this many times the
bfloat16 noise between the engines (E4M3 keeps 3 mantissa bits to bfloat16's 8: about 16 times the
rounding error, and every element moves, where bfloat16 noise is a few one-ulp flips)."""

MIN_SHIFT = 1e-3
"""...and by at least this fraction of the output's RMS, so a model where the engines agree exactly in
bfloat16 still needs a real change."""


def _rms(t: torch.Tensor) -> float:
    return t.double().square().mean().sqrt().item() if t.numel() else 0.0


@dataclass(frozen=True)
class RecipeEffect:
    """What a quantization recipe does to the TE engine's main output, all RMS over ``y``."""

    recipe: str
    noise: float
    """TE in bfloat16 (no recipe) vs the reference engine in bfloat16: the noise floor."""
    shift: float
    """TE under the recipe vs TE in bfloat16: what the recipe changed."""
    error: float
    """TE under the recipe vs the reference engine."""
    scale: float
    """The reference output's RMS."""

    @property
    def active(self) -> bool:
        return self.shift > ACTIVE_FACTOR * self.noise and self.shift > MIN_SHIFT * self.scale


def recipe_effect(
    config: Plan | Mapping[str, Any] | str,
    target: Target,
    recipe: Mapping[str, Any],
    *,
    tokens: int = 256,
    seq_len: int = DEFAULT_SEQ_LEN,
) -> RecipeEffect:
    """Proof that ``recipe`` is on: the same weights and input through the reference engine, TE without
    a recipe and TE under ``recipe``, all in bfloat16 and eval mode, on ``target``'s device with its seed
    (GPU only: recipes need one)."""
    plan = _plan_of(config)
    seed = target.seed
    base = Target("te", kernels="te", device=target.device, dtype=torch.bfloat16, seed=seed)
    plain = base.build(plan)
    quantized = dataclasses.replace(base, recipe=checked_recipe(recipe)).build(plan)
    reference = base.build(plan, seed=seed, engine="reference")
    fill_constant_parameters(reference, seed)
    x, inputs = base.sample(plan, tokens, torch.Generator().manual_seed(seed), seq_len)
    outputs = []
    for model in (reference, plain, quantized):
        if model is not reference:
            copy_weights(reference, model)
        model.eval()
        with torch.no_grad():
            outputs.append(model(x, **inputs)[0].double())
    ref, y_plain, y_quant = outputs
    return RecipeEffect(
        recipe=str(recipe.get("name") or recipe.get("kind")),
        noise=_rms(y_plain - ref),
        shift=_rms(y_quant - y_plain),
        error=_rms(y_quant - ref),
        scale=_rms(ref),
    )


__all__ = [
    "ACTIVE_FACTOR",
    "MAIN_OUTPUT",
    "TOLERANCES",
    "RecipeEffect",
    "TensorComparison",
    "Tolerance",
    "VerifyReport",
    "compare",
    "copy_weights",
    "fill_constant_parameters",
    "precision_class",
    "recipe_effect",
    "state_dict_parameters",
    "verify",
]
