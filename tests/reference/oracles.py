"""Independent formulas for the reference ops: forward values and hand-derived vector-Jacobian products.

Written from the math, sharing no code with te_assembly nor with torch's modules (plain tensor
arithmetic, per-row Python loops where the ops vectorise, no autograd). The gradient tests hold both
engines to these: when the TE engine runs the reference ops (``kernels=reference``), ``verify`` compares
the reference math with itself, so a mistake in an op's backward can only show against an oracle.

An oracle is called with the op's primal inputs, its parameters (by state-dict name), and one
cotangent per output (``None`` for integer outputs, or for an output nobody uses: zero); it returns
the outputs and the gradient of ``sum(y * gy) + sum(out_i * g_i)`` with respect to ``x``, every float
extra input and every parameter.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

Tensor = torch.Tensor


@dataclass
class Result:
    y: Tensor
    outputs: list[Tensor]
    """Extra outputs in the catalog's slot order."""
    grad_x: Tensor
    grad_extras: list[Tensor | None]
    """One per extra input; None for integer inputs."""
    grad_params: dict[str, Tensor]


Extras = Sequence[Tensor]
Params = dict[str, Tensor]
Cot = Tensor | None
Cots = Sequence[Tensor | None]
Oracle = Callable[[Tensor, Extras, Params, Cot, Cots], Result]


def _cot(g: Tensor | None, like: Tensor) -> Tensor:
    """A cotangent; None (no consumer) counts as zero."""
    return torch.zeros_like(like) if g is None else g


def _cots(g: Sequence[Tensor | None], count: int) -> list[Tensor | None]:
    return [*g, *([None] * (count - len(g)))]


# --- activations: f and f' --------------------------------------------------------------------------


def _sigmoid(x: Tensor) -> Tensor:
    return 1 / (1 + torch.exp(-x))


_C = math.sqrt(2 / math.pi)
_K = 0.044715


def _gelu_tanh(x: Tensor) -> Tensor:
    return 0.5 * x * (1 + torch.tanh(_C * (x + _K * x**3)))


def _d_gelu_tanh(x: Tensor) -> Tensor:
    t = torch.tanh(_C * (x + _K * x**3))
    return 0.5 * (1 + t) + 0.5 * x * (1 - t**2) * _C * (1 + 3 * _K * x**2)


def _qgelu(x: Tensor) -> Tensor:
    return x * _sigmoid(1.702 * x)


def _d_qgelu(x: Tensor) -> Tensor:
    s = _sigmoid(1.702 * x)
    return s + 1.702 * x * s * (1 - s)


def _relu(x: Tensor) -> Tensor:
    return torch.where(x > 0, x, torch.zeros_like(x))


def _d_relu(x: Tensor) -> Tensor:
    return (x > 0).to(x.dtype)


def _srelu(x: Tensor) -> Tensor:
    return _relu(x) ** 2


def _d_srelu(x: Tensor) -> Tensor:
    return 2 * _relu(x)


def _silu(x: Tensor) -> Tensor:
    return x * _sigmoid(x)


def _d_silu(x: Tensor) -> Tensor:
    s = _sigmoid(x)
    return s * (1 + x * (1 - s))


ACTIVATIONS: dict[str, tuple[Callable[[Tensor], Tensor], Callable[[Tensor], Tensor]]] = {
    "GELU": (_gelu_tanh, _d_gelu_tanh),
    "QGELU": (_qgelu, _d_qgelu),
    "ReLU": (_relu, _d_relu),
    "SReLU": (_srelu, _d_srelu),
    "SiLU": (_silu, _d_silu),
}
GATED = {"SwiGLU": "SiLU", "GEGLU": "GELU", "QGEGLU": "QGELU", "ReGLU": "ReLU", "SReGLU": "SReLU"}
"""TE's GLU family: act(first half) * second half."""


def activation(name: str) -> Oracle:
    f, df = ACTIVATIONS[name]

    def oracle(x: Tensor, extras: Extras, params: Params, gy: Cot, g: Cots) -> Result:
        return Result(f(x), [], _cot(gy, x) * df(x), [], {})

    return oracle


def gated(name: str) -> Oracle:
    f, df = ACTIVATIONS[GATED[name]]

    def oracle(x: Tensor, extras: Extras, params: Params, gy: Cot, g: Cots) -> Result:
        n = x.shape[-1] // 2
        a, b = x[..., :n], x[..., n:]
        gy = _cot(gy, b)
        return Result(f(a) * b, [], torch.cat([gy * b * df(a), gy * f(a)], dim=-1), [], {})

    return oracle


def scaled_swiglu(x: Tensor, extras: Extras, params: Params, gy: Cot, g: Cots) -> Result:
    """SwiGLU(x) * s per row; ``scales`` may come flat ([rows]) for a [..., 2n] x."""
    (scales,) = extras
    s = scales.reshape(x.shape[:-1])[..., None]
    n = x.shape[-1] // 2
    a, b = x[..., :n], x[..., n:]
    glu = _silu(a) * b
    gy = _cot(gy, glu)
    grad_x = torch.cat([gy * s * b * _d_silu(a), gy * s * _silu(a)], dim=-1)
    grad_s = (gy * glu).sum(-1).reshape(scales.shape)
    return Result(glu * s, [], grad_x, [grad_s], {})


def clamped_glu(scaled: bool, limit: float, alpha: float, offset: float) -> Oracle:
    """GPT-OSS's GLU on halves [a, b]: a' = min(a, limit), b' = clamp(b, +-limit), y = (b' + offset) *
    a' sigmoid(alpha a') (times s per row when scaled). dy/da = (b' + offset) (sig + alpha a' sig (1 -
    sig)) where a < limit, else 0; dy/db = a' sig where |b| < limit, else 0; dy/ds = the unscaled y."""

    def oracle(x: Tensor, extras: Extras, params: Params, gy: Cot, g: Cots) -> Result:
        n = x.shape[-1] // 2
        a, b = x[..., :n], x[..., n:]
        a_c, b_c = torch.minimum(a, torch.full_like(a, limit)), b.clamp(-limit, limit)
        sig = _sigmoid(alpha * a_c)
        act = a_c * sig
        glu = (b_c + offset) * act
        s = extras[0].reshape(x.shape[:-1])[..., None] if scaled else torch.ones_like(glu[..., :1])
        gy = _cot(gy, glu)
        d_act = (sig + alpha * a_c * sig * (1 - sig)) * (a < limit)
        grad_x = torch.cat([gy * s * (b_c + offset) * d_act, gy * s * act * (b.abs() < limit)], dim=-1)
        if not scaled:
            return Result(glu, [], grad_x, [], {})
        grad_s = (gy * glu).sum(-1).reshape(extras[0].shape)
        return Result(glu * s, [], grad_x, [grad_s], {})

    return oracle


def concat_extra_input(x: Tensor, extras: Extras, params: Params, gy: Cot, g: Cots) -> Result:
    """y = [x | tail]: each takes its own columns of the gradient."""
    (tail,) = extras
    y = torch.cat((x, tail), dim=-1)
    gy = _cot(gy, y)
    return Result(y, [], gy[..., : x.shape[-1]], [gy[..., x.shape[-1] :]], {})


# --- linear family ----------------------------------------------------------------------------------


def _affine(
    x: Tensor, weight: Tensor, bias: Tensor | None, gy: Tensor | None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """y = x W^T (+ b) over any leading dims; returns y, dx, dW, db."""
    xs = x.reshape(-1, x.shape[-1])
    y = xs @ weight.T
    if bias is not None:
        y = y + bias
    gs = _cot(gy, y).reshape(y.shape)
    return y.reshape(*x.shape[:-1], -1), (gs @ weight).reshape(x.shape), gs.T @ xs, gs.sum(0)


def basic_linear(x: Tensor, extras: Extras, params: Params, gy: Cot, g: Cots) -> Result:
    y, gx, gw, _ = _affine(x, params["weight"], None, gy)
    return Result(y, [], gx, [], {"weight": gw})


def bias(x: Tensor, extras: Extras, params: Params, gy: Cot, g: Cots) -> Result:
    gy = _cot(gy, x)
    return Result(x + params["bias"], [], gy, [], {"bias": gy.reshape(-1, gy.shape[-1]).sum(0)})


def linear(x: Tensor, extras: Extras, params: Params, gy: Cot, g: Cots) -> Result:
    b = params.get("basic_ops.1.bias")
    y, gx, gw, gb = _affine(x, params["basic_ops.0.weight"], b, gy)
    grads = {"basic_ops.0.weight": gw} | ({"basic_ops.1.bias": gb} if b is not None else {})
    return Result(y, [], gx, [], grads)


def grouped_linear(x: Tensor, extras: Extras, params: Params, gy: Cot, g: Cots) -> Result:
    """Row r belongs to group g when it falls in g's run of ``split_sizes``; with a ``scales`` input the
    bias is added times the row's scale (``scale_bias``). Row by row, the slow obvious way."""
    lead, x = x.shape[:-1], x.reshape(-1, x.shape[-1])
    gy = None if gy is None else gy.reshape(x.shape[0], -1)
    sizes = [int(n) for n in extras[0].reshape(-1).tolist()]
    scales = extras[1].reshape(-1) if len(extras) > 1 else None
    group_of = [grp for grp, n in enumerate(sizes) for _ in range(n)]
    has_bias = "bias0" in params
    y = x.new_zeros(x.shape[0], params["weight0"].shape[0])
    gy = _cot(gy, y)
    gx, gs = torch.zeros_like(x), None if scales is None else torch.zeros_like(scales)
    grads = {name: torch.zeros_like(p) for name, p in params.items()}
    for r, grp in enumerate(group_of):
        w = params[f"weight{grp}"]
        y[r] = w @ x[r]
        gx[r] = w.T @ gy[r]
        grads[f"weight{grp}"] += torch.outer(gy[r], x[r])
        if has_bias:
            b, scale = params[f"bias{grp}"], (1.0 if scales is None else scales[r])
            y[r] += scale * b
            grads[f"bias{grp}"] += scale * gy[r]
            if gs is not None:
                gs[r] = gy[r] @ b
    grad_extras: list[Tensor | None] = [None] if scales is None else [None, gs.reshape(extras[1].shape)]
    return Result(y.reshape(*lead, -1), [], gx.reshape(*lead, -1), grad_extras, grads)


# --- norms ------------------------------------------------------------------------------------------


def _gamma(params: dict[str, Tensor], zero_centered: bool) -> Tensor:
    return params["weight"] + 1 if zero_centered else params["weight"]


def _sum_leading(t: Tensor) -> Tensor:
    return t.reshape(-1, t.shape[-1]).sum(0)


def layer_norm(eps: float, zero_centered: bool) -> Oracle:
    """y = (x - mean) / sqrt(var + eps) * gamma + beta;
    dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)) with dxhat = dy * gamma."""

    def oracle(x: Tensor, extras: Extras, params: Params, gy: Cot, g: Cots) -> Result:
        mean = x.sum(-1, keepdim=True) / x.shape[-1]
        var = ((x - mean) ** 2).sum(-1, keepdim=True) / x.shape[-1]
        rstd = 1 / torch.sqrt(var + eps)
        xhat = (x - mean) * rstd
        gamma = _gamma(params, zero_centered)
        gy = _cot(gy, x)
        dxhat = gy * gamma
        gx = rstd * (dxhat - dxhat.mean(-1, keepdim=True) - xhat * (dxhat * xhat).mean(-1, keepdim=True))
        grads = {"weight": _sum_leading(gy * xhat), "bias": _sum_leading(gy)}
        return Result(xhat * gamma + params["bias"], [], gx, [], grads)

    return oracle


def rms_norm(eps: float, zero_centered: bool) -> Oracle:
    """y = x / sqrt(mean(x^2) + eps) * gamma; dx = rstd (dxhat - xhat mean(dxhat xhat))."""

    def oracle(x: Tensor, extras: Extras, params: Params, gy: Cot, g: Cots) -> Result:
        rstd = 1 / torch.sqrt((x * x).sum(-1, keepdim=True) / x.shape[-1] + eps)
        xhat = x * rstd
        gamma = _gamma(params, zero_centered)
        gy = _cot(gy, x)
        dxhat = gy * gamma
        gx = rstd * (dxhat - xhat * (dxhat * xhat).mean(-1, keepdim=True))
        return Result(xhat * gamma, [], gx, [], {"weight": _sum_leading(gy * xhat)})

    return oracle


# --- pass-through ops -------------------------------------------------------------------------------


def constant_scale(scale: float) -> Oracle:
    def oracle(x: Tensor, extras: Extras, params: Params, gy: Cot, g: Cots) -> Result:
        return Result(scale * x, [], scale * _cot(gy, x), [], {})

    return oracle


def add_extra_input(x: Tensor, extras: Extras, params: Params, gy: Cot, g: Cots) -> Result:
    gy = _cot(gy, x)
    return Result(x + extras[0], [], gy, [gy], {})


def make_extra_output(x: Tensor, extras: Extras, params: Params, gy: Cot, g: Cots) -> Result:
    return Result(x, [x], _cot(gy, x) + _cot(_cots(g, 1)[0], x), [], {})


def sigmoid_gate(x: Tensor, extras: Extras, params: Params, gy: Cot, g: Cots) -> Result:
    """y = x * s with s = sigmoid(u . w) per row, u the gate input: dy/dx = s; ds/dz = s (1 - s)."""
    (u,) = extras
    w = params["weight"]
    z = u @ w.T  # [..., 1]
    s = _sigmoid(z)
    gy = _cot(gy, x)
    gz = (gy * x).sum(-1, keepdim=True) * s * (1 - s)
    grad_w = (gz.reshape(-1, 1).T @ u.reshape(-1, u.shape[-1])).reshape(w.shape)
    return Result(x * s, [], gy * s, [gz * w], {"weight": grad_w})


def lora(args: dict[str, Any]) -> Oracle:
    """y = y_in + s * B_i A_i u per part i of the row (u the adapted projection's input, s = alpha / rank
    or alpha / sqrt(rank)); with split_sizes, row r's group g has its own A and B. Row by row:
    dy_in = gy; du = s * sum_i A_i^T B_i^T gy_i; dA_i = s * (B_i^T gy_i) u^T; dB_i = s * gy_i (A_i u)^T."""
    rank = args["rank"]
    scale = args["alpha"] / (math.sqrt(rank) if args["rslora"] else rank)
    parts = list(args["parts"] or [args["out_features"]])
    adapted = [True] * len(parts) if args["adapted"] is None else list(args["adapted"])
    starts = [sum(parts[:i]) for i in range(len(parts))]

    def run(x: Tensor, extras: Extras, params: Params, gy: Cot, g: Cots) -> Result:
        lead, y_in = x.shape[:-1], x.reshape(-1, x.shape[-1])
        u = extras[0].reshape(y_in.shape[0], -1)
        grouped = len(extras) > 1
        sizes = [int(n) for n in extras[1].reshape(-1).tolist()] if grouped else [y_in.shape[0]]
        group_of = [grp for grp, n in enumerate(sizes) for _ in range(n)]
        gy2 = _cot(None if gy is None else gy.reshape(y_in.shape), y_in)
        y, gu = y_in.clone(), torch.zeros_like(u)
        grads = {name: torch.zeros_like(p) for name, p in params.items()}
        for r, grp in enumerate(group_of):
            suffix = f"_{grp}" if grouped else ""
            for i, (start, width) in enumerate(zip(starts, parts, strict=True)):
                if not adapted[i]:
                    continue
                a, b = params[f"lora_A{i}{suffix}"], params[f"lora_B{i}{suffix}"]
                h = a @ u[r]
                y[r, start : start + width] += scale * (b @ h)
                gpart = gy2[r, start : start + width]
                gh = b.T @ gpart
                gu[r] += scale * (a.T @ gh)
                grads[f"lora_A{i}{suffix}"] += scale * torch.outer(gh, u[r])
                grads[f"lora_B{i}{suffix}"] += scale * torch.outer(gpart, h)
        grad_extras: list[Tensor | None] = [gu.reshape(extras[0].shape), *([None] if grouped else [])]
        return Result(y.reshape(*lead, -1), [], gy2.reshape(*lead, -1), grad_extras, grads)

    return run


def swap_extra_input(x: Tensor, extras: Extras, params: Params, gy: Cot, g: Cots) -> Result:
    """y = value, out = x: each gradient goes to the other tensor."""
    (value,) = extras
    return Result(value, [x], _cot(_cots(g, 1)[0], x), [_cot(gy, value)], {})


# --- mixture of experts -----------------------------------------------------------------------------


def top_k_router(
    num_experts: int,
    top_k: int,
    score_function: str,
    aux_loss_coeff: float,
    pre_softmax: bool = False,
    scaling_factor: float | None = None,
    sigmoid_renormalise: bool = True,
    bias: bool = False,
) -> Oracle:
    """Scores s = softmax(z) or sigmoid(z) of z = x W^T (+ b with a bias); each token keeps its top_k
    experts (highest score first) and probs = c * their scores / D, with D their sum (softmax without
    pre_softmax; sigmoid when top_k > 1) or 1, and c the scaling factor (1 when None); aux = coeff * E *
    sum_e f_e * mean_t q_te with f_e = (slots routed to e) / (tokens * top_k) and q = s (softmax) or
    s / sum_e s (sigmoid). Gradients by the chain rule through dprobs/ds and ds/dz, written out."""
    renormalise = (score_function == "softmax" and not pre_softmax) or (
        score_function == "sigmoid" and top_k > 1 and sigmoid_renormalise
    )
    c = 1.0 if scaling_factor is None else scaling_factor

    def oracle(x: Tensor, extras: Extras, params: Params, gy: Cot, g: Cots) -> Result:
        w = params["weight"]
        xs = x.reshape(-1, x.shape[-1])
        tokens = xs.shape[0]
        z = xs @ w.T + (params["bias"] if bias else 0)
        if score_function == "softmax":
            e = torch.exp(z - z.max(-1, keepdim=True).values)
            s = e / e.sum(-1, keepdim=True)
        else:
            s = _sigmoid(z)
        chosen = [
            sorted(range(num_experts), key=lambda j, t=t: -float(s[t, j]))[:top_k] for t in range(tokens)
        ]
        routing_map = torch.tensor(chosen, dtype=torch.int64)
        picked = torch.stack([s[t, chosen[t]] for t in range(tokens)])
        denominator = picked.sum(-1, keepdim=True) if renormalise else torch.ones_like(picked[:, :1])
        probs = c * picked / denominator
        q = s if score_function == "softmax" else s / s.sum(-1, keepdim=True)
        counts = torch.tensor(
            [sum(row.count(j) for row in chosen) for j in range(num_experts)], dtype=x.dtype
        )
        fraction = counts / (tokens * top_k)
        aux = aux_loss_coeff * num_experts * (fraction * q.mean(0)).sum()

        def ds_dz(t: int, a: int) -> Tensor:
            """The row d s[t, a] / d z[t, :]."""
            if score_function == "softmax":
                row = -s[t, a] * s[t]
                row[a] += s[t, a]
                return row
            row = torch.zeros_like(s[t])
            row[a] = s[t, a] * (1 - s[t, a])
            return row

        g_probs, _, g_aux = _cots(g, 3)
        gz = torch.zeros_like(z)
        if g_probs is not None:
            for t in range(tokens):
                d = denominator[t, 0]
                for k, a in enumerate(chosen[t]):
                    # d probs_i / d picked_k = c (delta_ik / D - picked_i / D^2 when renormalised)
                    g_picked = c * g_probs[t, k] / d
                    if renormalise:
                        g_picked = g_picked - c * (g_probs[t] * picked[t]).sum() / d**2
                    gz[t] += g_picked * ds_dz(t, a)
        if g_aux is not None:
            h = aux_loss_coeff * num_experts * fraction / tokens * g_aux  # d aux / d q_te, for every t
            centred = h - (q * h).sum(-1, keepdim=True)
            gz += (
                q * centred
                if score_function == "softmax"
                else s * (1 - s) / s.sum(-1, keepdim=True) * centred
            )
        gx = _cot(gy, x) + (gz @ w).reshape(x.shape)  # x passes through, and feeds the logits
        grads = {"weight": gz.T @ xs, **({"bias": gz.sum(0)} if bias else {})}
        return Result(x, [probs, routing_map, aux], gx, [], grads)

    return oracle


def stable_expert_order(routing_map: Tensor) -> list[int]:
    """Flat slot indices t * top_k + j sorted by expert, ties in slot order."""
    flat = [int(v) for v in routing_map.reshape(-1).tolist()]
    return sorted(range(len(flat)), key=lambda i: (flat[i], i))


def dispatch(num_experts: int, top_k: int) -> Oracle:
    def oracle(x: Tensor, extras: Extras, params: Params, gy: Cot, g: Cots) -> Result:
        probs, routing_map = extras
        shape, x = x.shape, x.reshape(-1, x.shape[-1])
        order = stable_expert_order(routing_map)
        rows = torch.stack([x[i // top_k] for i in order])
        flat_probs = probs.reshape(-1)
        row_probs = torch.stack([flat_probs[i] for i in order])
        counts = [int((routing_map == e).sum()) for e in range(num_experts)]
        gx, g_probs = torch.zeros_like(x), torch.zeros_like(flat_probs)
        gy, g_row_probs = _cot(gy, rows), _cots(g, 3)[1]
        for r, i in enumerate(order):
            gx[i // top_k] += gy[r]
            if g_row_probs is not None:
                g_probs[i] = g_row_probs[r]
        outputs = [torch.tensor(counts, dtype=torch.int64), row_probs, torch.tensor(order, dtype=torch.int64)]
        return Result(rows, outputs, gx.reshape(shape), [g_probs.reshape(probs.shape), None], {})

    return oracle


def combine(top_k: int) -> Oracle:
    def oracle(x: Tensor, extras: Extras, params: Params, gy: Cot, g: Cots) -> Result:
        token_of = [int(i) // top_k for i in extras[0].reshape(-1).tolist()]
        y = x.new_zeros(x.shape[0] // top_k, *x.shape[1:])
        gx, gy = torch.zeros_like(x), _cot(gy, y)
        for r, t in enumerate(token_of):
            y[t] += x[r]
            gx[r] = gy[t]
        return Result(y, [], gx, [None], {})

    return oracle


def for_op(op: str, args: dict[str, Any]) -> Oracle:
    """The oracle of catalog op ``op`` with (complete) ``args``."""
    if op in ACTIVATIONS:
        return activation(op)
    if op in GATED:
        return gated(op)
    simple: dict[str, Oracle] = {
        "ScaledSwiGLU": scaled_swiglu,
        "BasicLinear": basic_linear,
        "Bias": bias,
        "Linear": linear,
        "GroupedLinear": grouped_linear,
        "AddExtraInput": add_extra_input,
        "MakeExtraOutput": make_extra_output,
        "SigmoidGate": sigmoid_gate,
        "SwapExtraInput": swap_extra_input,
        "ConcatExtraInput": concat_extra_input,
    }
    if op in simple:
        return simple[op]
    if op in ("ClampedSwiGLU", "ScaledClampedQGeGLU"):
        return clamped_glu(op.startswith("Scaled"), args["limit"], args["alpha"], args["glu_linear_offset"])
    if op == "LayerNorm":
        return layer_norm(args["eps"], args["zero_centered_gamma"])
    if op == "RMSNorm":
        return rms_norm(args["eps"], args["zero_centered_gamma"])
    if op in ("LoRA", "GroupedLoRA"):
        return lora(args)
    if op == "ConstantScale":
        return constant_scale(args["scale"])
    if op in ("Identity", "Dropout"):  # Dropout: eval mode only
        return constant_scale(1.0)
    if op == "TopKRouter":
        return top_k_router(
            args["num_experts"],
            args["top_k"],
            args["score_function"],
            args["aux_loss_coeff"],
            args.get("pre_softmax", False),
            args.get("scaling_factor"),
            args.get("sigmoid_renormalise", True),
            args.get("bias", False),
        )
    if op == "Dispatch":
        return dispatch(args["num_experts"], args["top_k"])
    if op == "Combine":
        return combine(args["top_k"])
    raise KeyError(f"no oracle for {op}")


# --- a whole single-fuser model ----------------------------------------------------------------------


@dataclass
class ModelResult:
    y: Tensor
    outputs: dict[str, Tensor]
    """Public extra outputs by name."""
    grad_x: Tensor
    grad_inputs: dict[str, Tensor]
    """Gradients of the float public inputs, by name."""
    grad_params: dict[str, Tensor]
    """By state-dict name, ``steps.<step>.<param>``."""


@dataclass
class _Step:
    name: str
    oracle: Oracle
    x: Tensor
    extras: list[Tensor]
    params: Params
    inputs: list[tuple[str, str | None, bool]]
    """Per input slot: (slot, channel or None for a public input, is float)."""
    outputs: list[tuple[str, str | None, str | None]]
    """Per output slot: (slot, channel or None, public name or None)."""


def run_model(
    model: dict[str, Any],
    params: Params,
    x: Tensor,
    inputs: dict[str, Tensor],
    gy: Tensor,
    g_outputs: dict[str, Tensor],
) -> ModelResult:
    """Forward and reverse pass of a model mapping (ops only, numbers literal) from the oracles alone,
    with the config format's rules read off the mapping: a null or missing extra input is the public
    input ``<step>_<slot>``; an unlisted output is public as ``<step>_<slot>``, a listed one is named
    after its channel and public unless ``public: false``. A channel's gradient is the sum over its
    consumers, plus the caller's cotangent when it is public."""
    from te_assembly.catalog import OPS  # slot names and order only

    steps: list[_Step] = []
    channels: dict[str, Tensor] = {}
    outputs: dict[str, Tensor] = {}
    h = x
    for raw in model["ops"]:
        spec = OPS[raw["op"]]
        args = spec.with_defaults(raw.get("args") or {})
        name, bound_in, bound_out = raw["name"], raw.get("extra_inputs") or {}, raw.get("extra_outputs") or {}
        slots_in = [(s.name, bound_in.get(s.name), s.dtype == "float") for s in spec.input_slots(args)]
        extras = [channels[c] if c else inputs[f"{name}_{slot}"] for slot, c, _ in slots_in]
        slots_out = []
        for slot in spec.output_slots(args):
            binding = bound_out.get(slot.name)
            if binding is None:
                slots_out.append((slot.name, None, f"{name}_{slot.name}"))
            else:
                slots_out.append(
                    (slot.name, binding["channel"], binding["channel"] if binding["public"] else None)
                )
        own = {
            k.removeprefix(f"steps.{name}."): v for k, v in params.items() if k.startswith(f"steps.{name}.")
        }
        step = _Step(name, for_op(raw["op"], args), h, extras, own, slots_in, slots_out)
        result = step.oracle(h, extras, own, None, [])
        for (_, channel, public), value in zip(slots_out, result.outputs, strict=True):
            if channel is not None:
                channels[channel] = value
            if public is not None:
                outputs[public] = value
        steps.append(step)
        h = result.y

    grad_channels: dict[str, Tensor] = {}
    grad_inputs: dict[str, Tensor] = {}
    grad_params: dict[str, Tensor] = {}
    g_main = gy
    for step in reversed(steps):  # every consumer of a channel comes after its producer
        cots: list[Tensor | None] = []
        for _, channel, public in step.outputs:
            parts = [
                g for g in (grad_channels.get(channel or ""), g_outputs.get(public or "")) if g is not None
            ]
            cots.append(sum(parts[1:], parts[0]) if parts else None)
        result = step.oracle(step.x, step.extras, step.params, g_main, cots)
        g_main = result.grad_x
        grad_params.update({f"steps.{step.name}.{k}": v for k, v in result.grad_params.items()})
        for (slot, channel, is_float), grad in zip(step.inputs, result.grad_extras, strict=True):
            if not is_float or grad is None:
                continue
            if channel is None:
                grad_inputs[f"{step.name}_{slot}"] = grad
            else:
                grad_channels[channel] = grad_channels[channel] + grad if channel in grad_channels else grad
    return ModelResult(h, outputs, g_main, grad_inputs, grad_params)
