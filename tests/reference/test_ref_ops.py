"""Reference ops: math against closed forms, gradients, and parameter names against the catalog."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from te_assembly.catalog import OPS, load_object
from te_assembly.engines.reference.ops.activations import ScaledSwiGLU
from te_assembly.engines.reference.ops.linear import BasicLinear, GroupedLinear, Linear
from te_assembly.engines.reference.ops.moe import TopKRouter
from te_assembly.engines.reference.ops.norms import LayerNorm, RMSNorm
from te_assembly.engines.reference.ops.passthrough import AddExtraInput, Dropout, MakeExtraOutput

F64 = torch.float64

# Small values for each op's required params; defaults fill in the rest.
REQUIRED_ARGS: dict[str, dict[str, Any]] = {
    "Linear": {"in_features": 3, "out_features": 5},
    "BasicLinear": {"in_features": 3, "out_features": 5},
    "Bias": {"size": 4},
    "GroupedLinear": {"num_groups": 3, "in_features": 4, "out_features": 6},
    "LayerNorm": {"normalized_shape": 7},
    "RMSNorm": {"normalized_shape": 7},
    "ConstantScale": {"scale": 0.5},
    "Softcap": {"cap": 3.0},
    "Dropout": {"p": 0.1},
    "TopKRouter": {"in_features": 4, "num_experts": 5, "top_k": 2},
    "Dispatch": {"num_experts": 5, "top_k": 2},
    "Combine": {"top_k": 2},
    "SigmoidGate": {"in_features": 4},
    "ConcatExtraInput": {"in_features": 4, "tail_features": 2},
    "ShiftTokens": {"by": 2},
    "AheadLogits": {"depth": 1, "value_features": 4},
    "LoRA": {"in_features": 4, "out_features": 6, "rank": 2},
    "GroupedLoRA": {"num_groups": 3, "in_features": 4, "out_features": 6, "rank": 2},
}
VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("Linear", {"bias": False}),
    ("GroupedLinear", {"bias": False}),
    ("GroupedLinear", {"scale_bias": True}),
    ("TopKRouter", {"enable_expert_bias": True}),
    ("TopKRouter", {"bias": True}),
    ("LoRA", {"parts": [2, 4], "adapted": [False, True]}),
    ("GroupedLoRA", {"parts": [3, 3]}),
]


def _catalog_cases() -> list[tuple[str, dict[str, Any]]]:
    cases = [(name, dict(REQUIRED_ARGS.get(name, {}))) for name in OPS]
    return cases + [(name, {**REQUIRED_ARGS[name], **extra}) for name, extra in VARIANTS]


@pytest.mark.parametrize(("name", "args"), _catalog_cases())
def test_param_names_and_shapes_match_catalog(name: str, args: dict[str, Any]) -> None:
    spec = OPS[name]
    missing = [p.name for p in spec.params if p.required and p.name not in args]
    assert not missing, f"add required args for {name}: {missing}"
    full = spec.with_defaults(args)
    op = load_object(spec.reference)(**full)
    # Every state-dict entry: parameters, and persistent buffers (TopKRouter's expert_bias).
    got = {n: tuple(t.shape) for n, t in op.state_dict().items()}
    assert got == spec.param_shapes(full)


@pytest.mark.parametrize(
    ("name", "closed_form"),
    [
        ("GELU", lambda x: F.gelu(x, approximate="tanh")),
        ("QGELU", lambda x: x * torch.sigmoid(1.702 * x)),
        ("ReLU", lambda x: x.clamp(min=0)),
        ("SReLU", lambda x: x.clamp(min=0) ** 2),
        ("SiLU", lambda x: x / (1 + torch.exp(-x))),
    ],
)
def test_activation_closed_forms(name: str, closed_form: Any) -> None:
    x = torch.randn(4, 6, dtype=F64)
    y, extra = load_object(OPS[name].reference)()(x)
    assert extra == ()
    torch.testing.assert_close(y, closed_form(x))


@pytest.mark.parametrize(
    ("name", "gate"),
    [
        ("SwiGLU", lambda a: a / (1 + torch.exp(-a))),
        ("GEGLU", lambda a: F.gelu(a, approximate="tanh")),
        ("QGEGLU", lambda a: a * torch.sigmoid(1.702 * a)),
        ("ReGLU", lambda a: a.clamp(min=0)),
        ("SReGLU", lambda a: a.clamp(min=0) ** 2),
    ],
)
def test_gated_activations_gate_the_first_half(name: str, gate: Any) -> None:
    a, b = torch.randn(3, 5, dtype=F64), torch.randn(3, 5, dtype=F64)
    y, _ = load_object(OPS[name].reference)()(torch.cat([a, b], dim=-1))
    torch.testing.assert_close(y, gate(a) * b)


def test_scaled_swiglu_value_and_gradcheck() -> None:
    x = torch.randn(2, 3, 8, dtype=F64, requires_grad=True)
    scales = torch.rand(2, 3, dtype=F64, requires_grad=True)
    op = ScaledSwiGLU()
    y, _ = op(x, (scales,))
    a, b = x.detach().chunk(2, dim=-1)
    torch.testing.assert_close(y, F.silu(a) * b * scales.detach()[..., None])
    assert y.requires_grad  # gradcheck would skip a detached output
    assert torch.autograd.gradcheck(lambda x_, s_: op(x_, (s_,))[0], (x, scales))


def test_linear_matches_torch_and_zero_bias_init() -> None:
    op = Linear(in_features=3, out_features=4, dtype=F64)
    weight, bias = op.get_parameter("basic_ops.0.weight"), op.get_parameter("basic_ops.1.bias")
    assert torch.count_nonzero(bias) == 0
    x = torch.randn(2, 5, 3, dtype=F64)
    y, _ = op(x)
    torch.testing.assert_close(y, x @ weight.T + bias)


def grad_of(op: torch.nn.Module, name: str) -> torch.Tensor:
    grad = op.get_parameter(name).grad
    assert grad is not None, f"{name} got no gradient"
    return grad


def _grouped(scale_bias: bool) -> GroupedLinear:
    op = GroupedLinear(num_groups=3, in_features=3, out_features=2, scale_bias=scale_bias, dtype=F64)
    with torch.no_grad():
        for g in range(3):
            getattr(op, f"bias{g}").normal_()  # zero init would hide bias mistakes
    return op


def test_grouped_linear_groups_rows_and_scales_bias() -> None:
    op = _grouped(scale_bias=True)
    x, scales = torch.randn(6, 3, dtype=F64), torch.rand(6, dtype=F64)
    sizes = [2, 0, 4]
    y, _ = op(x, (torch.tensor(sizes), scales))
    group_of_row = [0, 0, 2, 2, 2, 2]
    want = torch.stack(
        [
            x[r] @ getattr(op, f"weight{g}").T + scales[r] * getattr(op, f"bias{g}")
            for r, g in enumerate(group_of_row)
        ]
    )
    torch.testing.assert_close(y, want)


@pytest.mark.parametrize("scale_bias", [False, True])
def test_grouped_linear_gradcheck(scale_bias: bool) -> None:
    op = _grouped(scale_bias)
    params = [p for _, p in sorted(op.named_parameters())]
    x = torch.randn(5, 3, dtype=F64, requires_grad=True)
    scales = torch.rand(5, dtype=F64, requires_grad=True)
    sizes = torch.tensor([1, 3, 1])

    def run(x_: torch.Tensor, s_: torch.Tensor, *ps: torch.Tensor) -> torch.Tensor:
        state = dict(zip(sorted(n for n, _ in op.named_parameters()), ps, strict=True))
        extra = (sizes, s_) if scale_bias else (sizes,)
        return torch.func.functional_call(op, state, (x_, extra))[0]

    assert run(x, scales, *params).requires_grad  # gradcheck would skip a detached output
    assert torch.autograd.gradcheck(run, (x, scales, *params))


def test_grouped_linear_empty_group_has_zero_grad() -> None:
    op = _grouped(scale_bias=False)
    x = torch.randn(4, 3, dtype=F64, requires_grad=True)
    y, _ = op(x, (torch.tensor([0, 4, 0]),))
    y.square().sum().backward()
    for g in (0, 2):
        assert torch.count_nonzero(grad_of(op, f"weight{g}")) == 0
        assert torch.count_nonzero(grad_of(op, f"bias{g}")) == 0
    assert torch.count_nonzero(grad_of(op, "weight1")) > 0


@pytest.mark.parametrize(
    ("sizes", "message"),
    [
        ([1, 1, 1], r"split sizes \[1, 1, 1\] do not sum to the 4 input rows"),
        ([2, 2], "expects 3 split sizes, got 2"),
        ([-1, 3, 2], r"split sizes \[-1, 3, 2\] do not sum to the 4 input rows"),
    ],
)
def test_grouped_linear_rejects_bad_split_sizes(sizes: list[int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _grouped(scale_bias=False)(torch.randn(4, 3, dtype=F64), (torch.tensor(sizes),))


@pytest.mark.parametrize("scale_bias", [False, True])
def test_grouped_linear_output_keeps_x_dtype_and_leading_dims(scale_bias: bool) -> None:
    op = GroupedLinear(num_groups=2, in_features=3, out_features=2, scale_bias=scale_bias)
    x = torch.randn(2, 3, 3)  # six rows in two leading dims
    extra = (torch.tensor([4, 2]), torch.rand(6, dtype=F64)) if scale_bias else (torch.tensor([4, 2]),)
    y, _ = op(x, extra)  # float64 scales must not promote a float32 output
    assert y.shape == (2, 3, 2) and y.dtype == torch.float32


def test_scaled_swiglu_output_keeps_x_dtype() -> None:
    y, _ = ScaledSwiGLU()(torch.randn(3, 8), (torch.rand(3, dtype=F64),))
    assert y.dtype == torch.float32


@pytest.mark.parametrize("name", sorted(OPS))
def test_reference_constructor_defaults_are_the_catalogs(name: str) -> None:
    """The catalog is the one source of defaults; a reference op built from Python with its own
    defaults must build the same op (eps, zero_centered_gamma, bias, score_function...)."""
    import inspect

    spec = OPS[name]
    cls = load_object(spec.reference)
    signature = inspect.signature(cls)
    for param in spec.params:
        if param.required:
            continue
        assert signature.parameters[param.name].default == param.default, (name, param.name)
    # And the op built from its required arguments alone holds them.
    op = cls(**{p.name: REQUIRED_ARGS[name][p.name] for p in spec.params if p.required})
    for param in spec.params:
        if not param.required and hasattr(op, param.name):
            assert getattr(op, param.name) == param.default, (name, param.name)
    assert hasattr(op, "bias") == bool(
        spec.param_shapes(spec.with_defaults(REQUIRED_ARGS.get(name, {}))).get("bias")
    )


@pytest.mark.parametrize("in_features", [16, 64])
def test_weights_start_as_torch_and_te_initialise_them(in_features: int) -> None:
    """kaiming_uniform(a=sqrt(5)): uniform on +-1/sqrt(in_features), as torch.nn.Linear and TE do."""
    torch.manual_seed(0)
    for op in (
        BasicLinear(in_features, 256),
        GroupedLinear(2, in_features, 128),
        TopKRouter(in_features, 256, 1),
    ):
        weights = torch.cat([p.detach().reshape(-1) for n, p in op.named_parameters() if "weight" in n])
        bound = 1 / math.sqrt(in_features)
        assert weights.abs().max() <= bound and weights.abs().max() > 0.97 * bound
        assert abs(float(weights.mean())) < 0.05 * bound


@pytest.mark.parametrize("zero_centered", [False, True])
def test_norms(zero_centered: bool) -> None:
    x = torch.randn(3, 6, dtype=F64)
    ln = LayerNorm(6, eps=1e-5, zero_centered_gamma=zero_centered, dtype=F64)
    rms = RMSNorm(6, eps=1e-5, zero_centered_gamma=zero_centered, dtype=F64)
    assert bool((ln.weight == (0.0 if zero_centered else 1.0)).all())
    with torch.no_grad():
        ln.weight.fill_(0.5)
        ln.bias.fill_(0.25)
        rms.weight.fill_(0.5)
    gamma = 1.5 if zero_centered else 0.5
    mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
    torch.testing.assert_close(ln(x)[0], (x - mean) / torch.sqrt(var + 1e-5) * gamma + 0.25)
    torch.testing.assert_close(rms(x)[0], x / torch.sqrt(x.square().mean(-1, keepdim=True) + 1e-5) * gamma)


def test_passthrough_ops() -> None:
    x, addend = torch.randn(2, 3), torch.randn(2, 3)
    y, (out,) = MakeExtraOutput(in_place=True)(x)
    assert y is x and out is x
    summed, _ = AddExtraInput(in_place=True)(x, (addend,))
    torch.testing.assert_close(summed, x + addend)
    assert summed is not x and summed.data_ptr() != addend.data_ptr()
    torch.testing.assert_close(load_object(OPS["ConstantScale"].reference)(scale=-2.0)(x)[0], -2 * x)
    assert load_object(OPS["Identity"].reference)()(x)[0] is x


@pytest.mark.parametrize("p", [0.2, 0.7])
def test_dropout_drops_p_of_the_elements_and_rescales(p: float) -> None:
    torch.manual_seed(0)
    y, _ = Dropout(p=p)(torch.ones(20000, dtype=F64))
    assert abs(float((y == 0).double().mean()) - p) < 0.02
    torch.testing.assert_close(y[y != 0], torch.full_like(y[y != 0], 1 / (1 - p)))


def test_dropout_respects_training() -> None:
    x = torch.ones(1000)
    op = Dropout(p=0.5)
    y_train, _ = op(x)
    assert 0 < int((y_train == 0).sum()) < 1000
    op.eval()
    assert torch.equal(op(x)[0], x)
