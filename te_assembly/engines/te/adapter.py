"""One generic ``BasicOperation`` that runs a reference op (``engines/reference/ops``) inside TE's fuser.

With it, our own ops (router, dispatch, combine) run in TE's real ``OperationFuser`` next to TE's
kernels, and ``kernels=reference`` runs a whole model through TE's channel routing, locking and
gradient accumulation on a machine without a GPU. The math is the reference op's; gradients come
from autograd on a private graph built in ``fuser_forward`` and consumed in ``fuser_backward``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformer_engine.pytorch.ops import BasicOperation, FusedOperation
from transformer_engine.pytorch.ops.op import OperationContext

from te_assembly.catalog import OPS, load_object
from te_assembly.engines.reference.ops.base import ReferenceOp

Grads = Sequence[torch.Tensor | None]


class ReferenceAdapter(BasicOperation):
    """A TE basic op whose forward and backward are those of a wrapped ``ReferenceOp``.

    The adapter shares the reference op's parameter, buffer and submodule registries, so its
    ``state_dict`` names are the reference op's (``weight``, ``weight0``...) and ``.to()`` or
    ``load_state_dict`` act on the one set of tensors both objects see.
    """

    def __init__(self, reference: ReferenceOp, num_extra_inputs: int, num_extra_outputs: int) -> None:
        # BasicOperation.__init__ sizes the channel lists from these, so set them first (as TE's
        # GroupedLinear does for its optional second input).
        self.num_extra_inputs = num_extra_inputs
        self.num_extra_outputs = num_extra_outputs
        super().__init__()
        self._parameters = reference._parameters
        self._buffers = reference._buffers
        self._modules = reference._modules
        self._non_persistent_buffers_set = reference._non_persistent_buffers_set
        # Not a registered submodule: that would list every parameter a second time.
        self.__dict__["reference"] = reference

    def extra_repr(self) -> str:
        return f"reference={type(self.reference).__name__}"

    def train(self, mode: bool = True) -> ReferenceAdapter:
        self.reference.training = mode
        return super().train(mode)

    def op_forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        raise RuntimeError("ReferenceAdapter implements fuser_forward, not op_forward")

    def op_backward(self, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, Grads]:
        raise RuntimeError("ReferenceAdapter implements fuser_backward, not op_backward")

    def fuser_forward(  # type: ignore[override]
        self,
        basic_op_ctxs: list[OperationContext],
        input_: torch.Tensor,
        *,
        basic_op_extra_inputs: Sequence[Sequence[torch.Tensor | None]],
        prev_op_grad_output_quantizer: Any,
        next_op_input_quantizer: Any,
        basic_op_kwargs: list[dict[str, Any]],
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, ...]]]:
        ctx = basic_op_ctxs[0]
        needs_grad = bool(ctx.requires_grad)
        # Detached leaves: this op's autograd graph stays private to it, and TE's autograd function
        # (which runs this under no_grad) never sees a graph it did not build.
        x = _leaf(input_, needs_grad)
        extras = [_leaf(t, needs_grad) for t in basic_op_extra_inputs[0]]
        with torch.set_grad_enabled(needs_grad):
            y, extra_outputs = self.reference(x, extras)
        if len(extra_outputs) != self.num_extra_outputs:
            raise RuntimeError(
                f"{type(self.reference).__name__} returned {len(extra_outputs)} extra outputs, "
                f"expected {self.num_extra_outputs}"
            )
        if needs_grad:
            ctx.reference_graph = (x, extras, y, tuple(extra_outputs))
        # Hand TE fresh tensor objects: its autograd function re-targets the grad_fn of what it
        # returns, which must not touch the private graph kept for backward.
        return y.detach(), [tuple(t.detach() for t in extra_outputs)]

    def fuser_backward(  # type: ignore[override]
        self,
        basic_op_ctxs: list[OperationContext],
        grad_output: torch.Tensor,
        *,
        basic_op_grad_extra_outputs: Sequence[Sequence[torch.Tensor | None]],
    ) -> tuple[
        torch.Tensor | None, list[tuple[torch.Tensor | None, ...]], list[tuple[torch.Tensor | None, ...]]
    ]:
        ctx = basic_op_ctxs[0]
        x, extras, y, extra_outputs = ctx.reference_graph
        del ctx.reference_graph
        params = list(self.parameters())
        # A None gradient means the output has no consumer downstream: it counts as zero.
        pairs = [
            (out, grad)
            for out, grad in zip(
                (y, *extra_outputs), (grad_output, *basic_op_grad_extra_outputs[0]), strict=True
            )
            if grad is not None and out.requires_grad
        ]
        wrt = [t for t in (x, *params, *extras) if t.requires_grad]
        found: dict[int, torch.Tensor | None] = {}
        if pairs and wrt:
            grads = torch.autograd.grad([o for o, _ in pairs], wrt, [g for _, g in pairs], allow_unused=True)
            found = {id(t): g for t, g in zip(wrt, grads, strict=True)}
        grad_input = _or_zeros(found.get(id(x)), x)
        grad_params = tuple(found.get(id(p)) for p in params)
        grad_extras = tuple(_or_zeros(found.get(id(t)), t) if t.is_floating_point() else None for t in extras)
        return grad_input, [grad_params], [grad_extras]


def _leaf(tensor: torch.Tensor | None, needs_grad: bool) -> torch.Tensor:
    if tensor is None:
        raise RuntimeError("an extra input reached a reference op unset (TE left a channel slot empty)")
    leaf = tensor.detach()
    if needs_grad and leaf.is_floating_point():
        leaf.requires_grad_(True)
    return leaf


def _or_zeros(grad: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    return grad if grad is not None else torch.zeros_like(like)


def reference_op(
    op_type: str, args: dict[str, Any], device: torch.device, dtype: torch.dtype
) -> BasicOperation | FusedOperation:
    """A TE op running the reference math of catalog op ``op_type``. A TE fused op (``Linear``) becomes a
    ``FusedOperation`` of adapters of its basic ops (catalog ``expands_to``), so basic-op indices and
    parameter names (``basic_ops.0.weight``) are the ones TE's own op has."""
    spec = OPS[op_type]
    if spec.expands_to is not None:
        return FusedOperation(
            [reference_op(name, basic_args, device, dtype) for name, basic_args in spec.basic_ops(args)]
        )
    reference = load_object(spec.reference)(**args, device=device, dtype=dtype)
    return ReferenceAdapter(reference, len(spec.input_slots(args)), len(spec.output_slots(args)))
