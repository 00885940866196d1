"""The call API checks what it is given, in both engines: x's width, every public input's shape, dtype
kind and device, before any op runs; ``build`` rejects bad arguments with typed errors; the reference
engine takes second derivatives and the TE engine refuses them loudly."""

from __future__ import annotations

import copy
import io
import pickle
from pathlib import Path

import pytest
import torch

import te_assembly
from te_assembly.engines import build
from te_assembly.engines.base import AssembledModel, CallError, InputShapeError
from te_assembly.engines.target import Target
from te_assembly.errors import ArgumentError, ConfigError, EngineUnavailableError, ResourceError
from tests.engines._helpers import F64, plan_from_yaml, randomize

ENGINES = [
    pytest.param(("reference", "te"), id="reference"),
    pytest.param(("te", "reference"), id="te-kernels-reference", marks=pytest.mark.te),
]

SAMPLED = """
name: sampled
in_features: 6
ops:
  - name: add
    op: AddExtraInput
  - name: dispatch
    op: Dispatch
    args: {num_experts: 3, top_k: 2}
  - name: fc
    op: GroupedLinear
    args: {num_groups: 3, in_features: 6, out_features: 4, scale_bias: true}
  - name: combine
    op: Combine
    args: {top_k: 2}
"""


def _build(config: object, engine: tuple[str, str]) -> AssembledModel:
    torch.manual_seed(0)
    model = build(config, Target.of(engine[0], kernels=engine[1], dtype=F64))  # type: ignore[arg-type]
    randomize(model)
    return model


def _sampled_inputs(tokens: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    probs = torch.rand(tokens, 2, generator=gen, dtype=F64) + 0.1
    return {
        "add_addend": torch.randn(tokens, 6, generator=gen, dtype=F64),
        "dispatch_probs": probs / probs.sum(-1, keepdim=True),
        "dispatch_routing_map": torch.rand(tokens, 3, generator=gen).topk(2, dim=-1).indices,
        "fc_split_sizes": torch.tensor([tokens, tokens - 1, 1]),
        "fc_scales": torch.rand(2 * tokens, generator=gen, dtype=F64),
        "combine_row_map": torch.randperm(2 * tokens, generator=gen),
    }


@pytest.mark.parametrize("engine", ENGINES)
def test_x_of_the_wrong_width_is_refused_before_any_op(engine: tuple[str, str]) -> None:
    model = _build("residual_mlp", engine)
    width = model.plan.in_features
    for call in (model, model.forward_positional):
        with pytest.raises(
            InputShapeError, match=rf"takes x of shape \[\.\.\., {width}\].*got shape \(5, 7\)"
        ):
            call(torch.randn(5, 7, dtype=F64))
        with pytest.raises(InputShapeError, match=r"got shape \(\)"):
            call(torch.tensor(1.0, dtype=F64))
    # After a good call (whose shape is remembered), a bad one is still caught.
    model(torch.randn(5, width, dtype=F64))
    with pytest.raises(InputShapeError):
        model(torch.randn(5, width + 1, dtype=F64))


@pytest.mark.parametrize("engine", ENGINES)
def test_x_must_be_a_floating_point_tensor(engine: tuple[str, str]) -> None:
    model = _build("residual_mlp", engine)
    width = model.plan.in_features
    with pytest.raises(CallError, match=r"x must be a torch.Tensor, got list"):
        model([[0.0] * width])  # type: ignore[arg-type]
    with pytest.raises(InputShapeError, match=r"floating-point.*torch.int64"):
        model(torch.ones(3, width, dtype=torch.int64))
    assert issubclass(InputShapeError, CallError) and issubclass(InputShapeError, ValueError)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_public_input_that_would_broadcast_is_refused(engine: tuple[str, str]) -> None:
    model = _build("two_stage", engine)
    x = torch.randn(4, 32, dtype=F64)
    good = torch.randn(4, 32, dtype=F64)
    y, _ = model(x, bias_in_addend=good)
    assert y.shape == (4, 32)
    # [4, 1, 32] + [4, 32] broadcasts to [4, 4, 32]: y would silently change shape.
    for bad in (good[:, None, :], good[:1], good[0], good[:, :16]):
        with pytest.raises(
            InputShapeError, match=r"'bias_in_addend'.*must have shape \[4, 32\] for x of shape"
        ):
            model(x, bias_in_addend=bad)
        with pytest.raises(InputShapeError):
            model.forward_positional(x, bad)
    # Leading dims follow x: [2, 2, 32] is right for an x of [2, 2, 32].
    y, _ = model(x.reshape(2, 2, 32), bias_in_addend=good.reshape(2, 2, 32))
    assert y.shape == (2, 2, 32)
    with pytest.raises(InputShapeError, match=r"must have shape \[2, 2, 32\]"):
        model(x.reshape(2, 2, 32), bias_in_addend=good)


@pytest.mark.parametrize("engine", ENGINES)
def test_public_inputs_after_a_dispatch_are_checked_in_dispatched_rows(engine: tuple[str, str]) -> None:
    model = _build(plan_from_yaml(SAMPLED), engine)
    tokens = 5
    x = torch.randn(tokens, 6, dtype=F64)
    inputs = _sampled_inputs(tokens)
    y, _ = model(x, **inputs)
    assert y.shape == (tokens, 4)
    wrong = {
        "add_addend": (torch.randn(tokens, 1, dtype=F64), r"\[5, 6\]"),
        "dispatch_probs": (inputs["dispatch_probs"][:, :1], r"\[5, 2\]"),
        "dispatch_routing_map": (inputs["dispatch_routing_map"].reshape(-1), r"\[5, 2\]"),
        "fc_split_sizes": (torch.tensor([tokens, tokens]), r"\[3\]"),
        "fc_scales": (inputs["fc_scales"][:tokens], r"\[10\]"),  # one scale per dispatched row
        "combine_row_map": (torch.randperm(tokens), r"\[10\]"),
    }
    for name, (value, shape) in wrong.items():
        with pytest.raises(InputShapeError, match=rf"'{name}'.*must have shape {shape}"):
            model(x, **{**inputs, name: value})


@pytest.mark.parametrize("engine", ENGINES)
def test_public_inputs_must_have_the_right_dtype_kind(engine: tuple[str, str]) -> None:
    model = _build(plan_from_yaml(SAMPLED), engine)
    x = torch.randn(5, 6, dtype=F64)
    inputs = _sampled_inputs(5)
    with pytest.raises(
        InputShapeError, match=r"'fc_split_sizes'.*must be an integer tensor, got torch.float64"
    ):
        model(x, **{**inputs, "fc_split_sizes": inputs["fc_split_sizes"].double()})
    with pytest.raises(
        InputShapeError, match=r"'add_addend'.*must be a floating-point tensor, got torch.int64"
    ):
        model(x, **{**inputs, "add_addend": torch.ones(5, 6, dtype=torch.int64)})
    with pytest.raises(CallError, match=r"'fc_scales' must be a torch.Tensor, got list"):
        model(x, **{**inputs, "fc_scales": [1.0] * 10})


def test_named_call_errors_still_name_the_input() -> None:
    model = _build("two_stage", ("reference", "te"))
    x = torch.randn(4, 32, dtype=F64)
    with pytest.raises(CallError, match=r"missing public input.*bias_in_addend"):
        model(x)
    with pytest.raises(CallError, match=r"no public input 'bias_in_adend'.*did you mean 'bias_in_addend'"):
        model(x, bias_in_adend=x)
    with pytest.raises(CallError, match=r"takes 1 public extra input"):
        model.forward_positional(x)


def test_models_stay_picklable_and_copyable() -> None:
    model = _build("two_stage", ("reference", "te"))
    x, b = torch.randn(3, 32, dtype=F64), torch.randn(3, 32, dtype=F64)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    for other in (
        torch.load(buffer, weights_only=False),
        copy.deepcopy(model),
        pickle.loads(pickle.dumps(model)),
    ):
        torch.testing.assert_close(other(x, bias_in_addend=b).y, model(x, bias_in_addend=b).y)
        with pytest.raises(InputShapeError):
            other(x, bias_in_addend=b[:, :1])


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((None,), {}, r"expected a Plan, a model mapping.*got None"),
        ((5,), {}, r"got 5 \(int\)"),
        (("",), {}, "got ''"),
        ((Path("/nonexistent/model.yaml"),), {}, "no such file"),
        (
            ("residual_mlp",),
            {"dtype": torch.int64},
            "dtype must be a floating-point torch.dtype.*torch.int64",
        ),
        (("residual_mlp",), {"dtype": "float32"}, "dtype must be a floating-point"),
        (("residual_mlp",), {"dtype": torch.complex64}, "dtype must be a floating-point"),
        (("residual_mlp",), {"engine": None}, "unknown engine None"),
        (("residual_mlp",), {"engine": "refrence"}, "unknown engine 'refrence'.*did you mean 'reference'"),
        (("residual_mlp",), {"kernels": 3}, "unknown kernels 3"),
        (("residual_mlp",), {"device": "mps"}, "device 'mps' is not supported"),
        (("residual_mlp",), {"device": "not-a-device"}, "unknown device 'not-a-device'"),
        (("residual_mlp",), {"device": 1.5}, "device must be a str or torch.device"),
        (("residual_mlp",), {"recipe": 3}, "recipe must be a mapping"),
    ],
)
def test_build_rejects_bad_arguments_with_typed_errors(
    args: tuple[object, ...], kwargs: dict[str, object], message: str
) -> None:
    kwargs = {"engine": "reference", **kwargs}
    with pytest.raises(ArgumentError, match=message) as info:
        te_assembly.build(*args, te_assembly.Target.of(**kwargs))  # type: ignore[arg-type]
    assert isinstance(info.value, TypeError) and isinstance(info.value, ValueError)


def test_build_reports_other_problems_with_their_own_types(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        build({"name": "bad", "in_features": 4, "ops": [{"name": "a", "op": "Lineer"}]}, "reference")
    if not torch.cuda.is_available():
        with pytest.raises(EngineUnavailableError, match=r"no CUDA GPU"):
            build("residual_mlp", Target.of("reference", device="cuda"))
    with pytest.raises(ArgumentError, match=r"a directory"):
        build(tmp_path, "reference")


def test_build_refuses_parameters_that_cannot_fit_before_allocating() -> None:
    huge = {
        "name": "huge",
        "in_features": 4,
        "ops": [{"name": "fc", "op": "Linear", "args": {"in_features": 4, "out_features": 10**11}}],
    }
    # (4 + 1) * 10**11 float32 values = 2e12 bytes = 1.8 TiB, far more than any CI machine has.
    with pytest.raises(
        ResourceError,
        match=r"building huge needs about 1\.8 TiB.*\(parameters 1\.8 TiB\), but only .* is available",
    ):
        build(huge, "reference")
    # Near the top of int64: more than any machine holds, so validation refuses it (with the count),
    # never an overflow inside torch.
    huge["ops"][0]["args"]["out_features"] = 2**62  # type: ignore[index]
    with pytest.raises(ConfigError) as too_large:
        build(huge, "reference")
    [diag] = too_large.value.diagnostics
    assert diag.code == "model-too-large" and "2.31e+19 parameters" in diag.message
    # Beyond int64: refused with the config's own range check, before any estimate.
    huge["ops"][0]["args"]["out_features"] = 2**70  # type: ignore[index]
    with pytest.raises(ConfigError) as caught:
        build(huge, "reference")
    [diag] = caught.value.diagnostics
    assert (diag.code, diag.path) == ("out-of-range", "model.ops[0].args.out_features")


def test_memory_limit_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = te_assembly.load("residual_mlp").checked_plan()
    monkeypatch.setenv("TE_ASSEMBLY_MEMORY_LIMIT", "1000")
    with pytest.raises(ResourceError, match=r"only 1000 B is available \(TE_ASSEMBLY_MEMORY_LIMIT\)"):
        build(plan, "reference")
    monkeypatch.setenv("TE_ASSEMBLY_MEMORY_LIMIT", str(10**9))
    build(plan, "reference")
    monkeypatch.setenv("TE_ASSEMBLY_MEMORY_LIMIT", "1.5 KiB")
    with pytest.raises(ResourceError, match=r"only 1\.5 KiB is available \(TE_ASSEMBLY_MEMORY_LIMIT\)"):
        build(plan, "reference")


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("2000", 2000),
        ("2e9", 2 * 10**9),
        ("90MiB", 90 * 2**20),
        ("90 mib", 90 * 2**20),
        ("1.5GB", 15 * 10**8),
        ("2Gi", 2 * 2**30),
        ("3 TB", 3 * 10**12),
        ("0", 0),
        ("512b", 512),
    ],
)
def test_memory_sizes_take_units(text: str, size: int) -> None:
    from te_assembly.engines.memory import parse_size

    assert parse_size(text, "X") == size


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("90M", "'M' alone is ambiguous"),
        ("2g", "'G' alone is ambiguous"),
        ("-5", "is not a size"),
        ("lots", "is not a size"),
        ("5 MiBs", "is not a size"),
        ("1e9.5", "is not a size"),
    ],
)
def test_a_memory_limit_that_is_not_a_size_is_refused_not_ignored(
    monkeypatch: pytest.MonkeyPatch, text: str, words: str
) -> None:
    """It used to be ignored: a user who wrote 90M got no limit at all, and no word of it."""
    plan = te_assembly.load("residual_mlp").checked_plan()
    monkeypatch.setenv("TE_ASSEMBLY_MEMORY_LIMIT", text)
    with pytest.raises(ResourceError, match="TE_ASSEMBLY_MEMORY_LIMIT=") as caught:
        build(plan, "reference")
    assert words in str(caught.value)


@pytest.mark.parametrize("name", ["moe_block", "two_stage", "residual_mlp"])
def test_reference_engine_takes_second_derivatives(name: str) -> None:
    small = {  # gradgradcheck's numerical Jacobians grow with the square of the sizes
        "moe_block": ["model.dims.hidden=4", "model.dims.ffn=3", "model.dims.experts=3"],
        "two_stage": ["model.dims.hidden=4"],
        "residual_mlp": ["model.dims.hidden=4", "model.dims.ffn=6"],
    }
    overrides = small[name]
    plan = te_assembly.load(name, overrides).checked_plan()
    model = _build(plan, ("reference", "te"))
    width = plan.in_features
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(5, width, generator=gen, dtype=F64, requires_grad=True)
    inputs = [torch.randn(5, width, generator=gen, dtype=F64, requires_grad=True) for _ in plan.public_inputs]

    def f(x: torch.Tensor, *ins: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = model(x, *ins)
        return (out.y, *out.extras.values())

    assert torch.autograd.gradgradcheck(f, (x, *inputs))
    # And a gradient penalty reaches the parameters (the router included, for the MoE block).
    (grad_x,) = torch.autograd.grad(model(x, *inputs).y.square().sum(), x, create_graph=True)
    grad_x.square().sum().backward()
    first = next(iter(model.parameters()))
    assert first.grad is not None and first.grad.abs().sum() > 0


@pytest.mark.te
@pytest.mark.parametrize(("name", "kernels"), [("channel_demo", "te"), ("moe_block", "reference")])
def test_te_engine_refuses_second_derivatives(name: str, kernels: str) -> None:
    model = _build(name, ("te", kernels))
    x = torch.randn(6, model.plan.in_features, dtype=F64, requires_grad=True)
    (grad_x,) = torch.autograd.grad(model(x).y.square().sum(), x, create_graph=True)
    with pytest.raises(
        RuntimeError, match=r"differentiate twice a function that was marked with @once_differentiable"
    ):
        grad_x.sum().backward()


def test_rows_a_padded_dispatch_makes_are_not_guessed() -> None:
    """After a Dispatch that pads groups (align > 1, when the catalog has it) or on a rank of a parallel
    layout, the row count depends on the data: only the layout and the width are checked."""
    from fractions import Fraction

    from te_assembly.engines.call_checks import InputRule, fits

    padded = InputRule("fc_scales", "fc.scales (GroupedLinear)", False, "rows", None, None, None)
    assert fits((37,), padded.shapes((5,))) and not fits((37, 1), padded.shapes((5,)))
    addend = InputRule("add_addend", "add.addend", False, "main", 6, None, Fraction(2))
    assert addend.shapes((5,)) == ((10, 6),)
    local = InputRule("add_addend", "add.addend", False, "main", 6, None, Fraction(1), local=True)
    assert fits((3, 6), local.shapes((5,))) and not fits((3, 5), local.shapes((5,)))
    model = _build(plan_from_yaml(SAMPLED), ("reference", "te"))
    model.local_input_checks()
    x, inputs = torch.randn(5, 6, dtype=F64), _sampled_inputs(5)
    model(x, **inputs)  # still accepted
    with pytest.raises(InputShapeError, match=r"'add_addend'.*must have shape \[\*, 6\]"):
        model(x, **{**inputs, "add_addend": torch.randn(5, 5, dtype=F64)})
