"""``parallel.shard``: a built model's parameters, gradients and optimizer state cut across ranks by
PyTorch's FSDP2 (``torch.distributed.fsdp.fully_shard``), as torchtitan and torchtune apply it.

Each block use (``layers.3``) is one FSDP2 unit: its parameters are gathered just before it runs and
freed after, in backward again, and its gradients reduce-scattered as soon as they are complete. What
is outside block uses (embeddings, the final norm, the vocabulary head, a model without blocks) is one
more unit, the root. The TE engine shards the whole model as its root: a fuser can span block uses, and
TE's fusers take their parameters through ``TEModel.configure(sharded=True)`` (TE issue #2713).

With ``parallel.data`` too, the mesh is ``(replicate, shard)``: HSDP, gradients reduce-scattered within
each shard group and all-reduced across the groups. The gradient is the mean over all ranks' rows, as
under DDP, so a sharded run's losses and weights are the single-process run's.

With ``parallel.expert`` (as torchtitan composes them): the weights every rank holds alike are cut over
the shard and expert ranks together; each step holding experts (a ``GroupedLinear`` with this rank's
slice of the experts) is a unit of its own, nested in its block use, cut over the ranks holding the
same experts (``mesh.fsdp_meshes``). Each rank's expert gradient already sums what every expert rank's
rows sent it back through the exchange, so FSDP2 divides their sum by every row shard
(``data * shard * expert``), not by the ranks of its mesh. The TE engine cannot do this (one unit for
the whole model: its fusers run ops without calling them as modules): refused at config time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from te_assembly.analysis.parallel.settings import TE_SHARDED_EXPERTS, TE_SHARDED_EXPERTS_HINT
from te_assembly.engines.base import AssembledModel
from te_assembly.engines.parallel.mesh import Mesh
from te_assembly.errors import ArgumentError


def mixed_precision(dtype: torch.dtype) -> Any:
    """The model's dtype for the gathered parameters; gradients reduced in float32 at least (bfloat16
    sums over ranks lose too much), float64 kept."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.promote_types(dtype, torch.float32))


def shard_model(
    model: AssembledModel, mesh: Mesh, dtype: torch.dtype, expert_steps: Sequence[str] = ()
) -> AssembledModel:
    """``model`` sharded in place: the modules of ``expert_steps`` over ``mesh.expert_device_mesh``,
    then each of ``model.shard_units()`` and the rest as the root over ``mesh.device_mesh``. Make the
    optimizer afterwards: it must hold the sharded parameters."""
    from torch.distributed.fsdp import fully_shard

    assert mesh.device_mesh is not None
    if expert_steps and model.engine != "reference":
        raise ArgumentError(f"{TE_SHARDED_EXPERTS}; {TE_SHARDED_EXPERTS_HINT}")
    model.configure(**{**model.configured, "sharded": True})
    policy = mixed_precision(dtype)
    for name in expert_steps:  # innermost first: a unit takes only parameters no inner unit took
        experts = fully_shard(model.step_module(name), mesh=mesh.expert_device_mesh, mp_policy=policy)
        experts.set_gradient_divide_factor(float(mesh.settings.data_shards))
        if mesh.backend == "gloo":  # FSDP2 would pick PREMUL_SUM for float32 and bfloat16: NCCL's only
            experts.set_force_sum_reduction_for_comms(True)  # sum, then divide
    for unit in model.shard_units():
        fully_shard(unit, mesh=mesh.device_mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh.device_mesh, mp_policy=policy)
    return model


__all__ = ["mixed_precision", "shard_model"]
