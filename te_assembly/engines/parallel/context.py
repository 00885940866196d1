"""``ParallelContext``: what the engines, the loops and checkpoints ask of a parallel layout.

One object per process: the plan's layout (``layout.ShardPlan``) plus this rank's place in the process
groups (``mesh.Mesh``). The engines ask it which module to build for a step; ``run``, ``train`` and
``bench`` ask it for this rank's rows of a batch, to wrap the model in ``DistributedDataParallel``, to
finish the gradients after backward, and to move state between its global and local forms.

Gradient semantics, whatever the layout: after ``finish_grads`` every rank holds the gradient of the
mean, over all the batch's row shards, of each shard's loss, for the slice of every parameter it holds;
a single process computing the same mean over the same rows gets the same numbers.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from te_assembly.analysis.parallel.layout import REPLICATED, ParamShard, ShardPlan, StepShard, shard_plan
from te_assembly.analysis.parallel.settings import ParallelSettings
from te_assembly.analysis.plan import Plan, PlannedStep
from te_assembly.catalog import OPS, OpSpec, load_object
from te_assembly.engines.parallel.collectives import TIMER, all_reduce
from te_assembly.engines.parallel.expert_ops import (
    ExpertExchange,
    ExpertParallelCombine,
    ExpertParallelDispatch,
)
from te_assembly.engines.parallel.mesh import Mesh, group_size
from te_assembly.engines.parallel.pieces import holders, is_cut, local_piece, reduce_grads, whole
from te_assembly.engines.parallel.sharding import join_slices, local_state
from te_assembly.engines.parallel.tensor_ops import TensorParallelBasicLinear, TensorParallelLinear
from te_assembly.errors import InjectedFailure, TeAssemblyError


class ParallelContext:
    def __init__(self, plan: Plan, layout: ShardPlan, mesh: Mesh | None) -> None:
        self.plan = plan
        self.layout = layout
        self.mesh = mesh
        self.settings: ParallelSettings = layout.settings
        self._exchanges: dict[int, ExpertExchange] = {}
        self.global_rules: dict[str, ParamShard] = {}
        """Global parameter key (``steps.<step>.<name>``) -> its layout, in the plan's parameter order."""
        self.global_shapes: dict[str, tuple[int, ...]] = {}
        self._load_rules: dict[str, tuple[str, str, ParamShard, int]] = {}
        self.local_to_global: dict[str, str] = {}
        """This rank's parameter keys -> global keys (they differ for experts: ``weight0`` is expert
        ``expert_rank * local_experts`` globally)."""
        expert_rank = mesh.expert_rank if mesh is not None else 0
        for planned, shard in zip(plan.steps, layout.steps, strict=True):
            prefix = f"steps.{planned.name}."
            groups = shard.local_groups
            for name in planned.param_shapes:
                rule = shard.params.get(name, REPLICATED)
                self.global_rules[prefix + name] = rule
                self.global_shapes[prefix + name] = tuple(planned.param_shapes[name])
                self._load_rules[prefix + name] = (prefix, name, rule, groups)
                local = _local_name(name, rule, expert_rank, groups)
                if local is not None:
                    self.local_to_global[prefix + local] = prefix + name

    @classmethod
    def single(cls, plan: Plan, settings: ParallelSettings | None = None) -> ParallelContext:
        """One process, nothing started (``settings`` of one rank: only ``fail_on_rank`` can act)."""
        layout, _ = shard_plan(plan, settings or ParallelSettings())
        assert layout is not None
        return cls(plan, layout, None)

    @property
    def is_parallel(self) -> bool:
        return self.mesh is not None and self.mesh.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.mesh is None or self.mesh.is_main

    @property
    def rank(self) -> int:
        return 0 if self.mesh is None else self.mesh.rank

    def device(self, default: torch.device) -> torch.device:
        """This rank's device (``cuda:<local rank>`` under torchrun on GPUs), else ``default``."""
        return self.mesh.device if self.mesh is not None else default

    # ---------------------------------------------------------------------------------------- building

    def reference_module(
        self, step: PlannedStep, device: torch.device, dtype: torch.dtype
    ) -> torch.nn.Module | None:
        """The split module for ``step`` on this rank, or None when the single-process one serves."""
        if self.mesh is None or step.kind != "op":
            return None
        shard = self.layout.step(step.name)
        mesh, s = self.mesh, self.settings
        spec = OPS[step.type]
        if shard.tensor_mode is not None and s.tensor > 1:
            common = {
                "mode": shard.tensor_mode,
                "group": mesh.tensor_group,
                "sequence_parallel": s.sequence_parallel,
                "device": device,
                "dtype": dtype,
            }
            features = (step.args["in_features"], step.args["out_features"])
            if spec.expands_to is not None:  # Linear: BasicLinear + Bias
                return TensorParallelLinear(*features, bias=bool(step.args.get("bias", True)), **common)
            return TensorParallelBasicLinear(*features, **common)
        local_args = self._local_args(step, shard)
        if s.expert > 1 and shard.expert_role == "dispatch":
            exchange = self._exchanges[step.index] = ExpertExchange()
            return ExpertParallelDispatch(
                load_object(spec.reference)(**local_args, device=device, dtype=dtype),
                num_experts=int(step.args[shard.sharding.expert_count or "num_experts"]),
                output_slots=[slot.name for slot in step.output_slots],
                sharding=shard.sharding,
                group=mesh.expert_group,
                exchange=exchange,
            )
        if s.expert > 1 and shard.expert_role == "combine":
            assert shard.pair is not None
            return ExpertParallelCombine(
                load_object(spec.reference)(**local_args, device=device, dtype=dtype),
                group=mesh.expert_group,
                exchange=self._exchanges[shard.pair],
            )
        if local_args != step.args:  # experts split, or an elementwise op's width sliced
            return load_object(spec.reference)(**local_args, device=device, dtype=dtype)
        return None

    def _local_args(self, step: PlannedStep, shard: StepShard) -> dict[str, Any]:
        args = dict(shard.local_args)
        if shard.tensor_role == "split" and self.settings.tensor > 1:
            for name in shard.sharding.split_args:
                args[name] = int(args[name]) // self.settings.tensor
        return args

    def te_op(self, step: PlannedStep, kernels: str, device: torch.device, dtype: torch.dtype) -> Any:
        """The TE op for ``step`` on this rank, or None when the single-process one serves. With TE's
        kernels a split Linear is TE's ``BasicLinear`` with ``tensor_parallel_mode``,
        ``tensor_parallel_group`` and ``sequence_parallel`` (then a ``Bias``: sliced for column, whole
        and after the reduction for row, see ``tensor_ops``); ``kernels=reference`` runs our split
        reference ops inside TE's fuser."""
        if self.mesh is None or step.kind != "op":
            return None
        from te_assembly.engines.te.adapter import ReferenceAdapter

        spec = OPS[step.type]
        shard = self.layout.step(step.name)
        if kernels == "te" and spec.te_class is not None:
            return self._te_kernel_op(step, spec, shard, device, dtype)
        module = self.reference_module(step, device, dtype)
        if module is None:
            return None
        if isinstance(module, TensorParallelLinear):
            from transformer_engine.pytorch.ops import FusedOperation

            return FusedOperation([ReferenceAdapter(op, 0, 0) for op in module.basic_ops])  # type: ignore[arg-type]
        return ReferenceAdapter(module, len(step.input_slots), len(step.output_slots))  # type: ignore[arg-type]

    def _te_kernel_op(
        self, step: PlannedStep, spec: OpSpec, shard: StepShard, device: torch.device, dtype: torch.dtype
    ) -> Any:
        import transformer_engine.pytorch.ops as te_ops

        assert self.mesh is not None
        s = self.settings
        if shard.tensor_mode is not None and s.tensor > 1:
            column = shard.tensor_mode == "column"
            linear = te_ops.BasicLinear(
                step.args["in_features"],
                step.args["out_features"],
                device=device,
                dtype=dtype,
                tensor_parallel_mode=shard.tensor_mode,
                tensor_parallel_group=self.mesh.tensor_group,
                sequence_parallel=s.sequence_parallel,
            )
            if spec.expands_to is None:
                return linear
            ops: list[Any] = [linear]
            if step.args.get("bias", True):
                ops.append(
                    te_ops.Bias(
                        step.args["out_features"],
                        device=device,
                        dtype=dtype,
                        tensor_parallel=column,
                        tensor_parallel_group=self.mesh.tensor_group if column else None,
                    )
                )
            return te_ops.FusedOperation(ops)
        local_args = self._local_args(step, shard)
        if local_args == step.args:
            return None
        cls = load_object(spec.te_class or "")
        args = {k: v for k, v in local_args.items() if k not in spec.validation_only_params}
        return cls(**args, device=device, dtype=dtype)

    # ------------------------------------------------------------------------------------------- state

    def load_global(
        self, model: torch.nn.Module, state: Mapping[str, torch.Tensor], *, strict: bool = True
    ) -> None:
        """Copy this rank's slices of a global state dict into ``model``'s parameters (``strict``
        False: only those the state holds, as an adapters-only checkpoint over a frozen base)."""
        mesh = self.mesh
        t, size, e = (mesh.tensor_rank, self.settings.tensor, mesh.expert_rank) if mesh else (0, 1, 0)
        mine = local_state(state, self._load_rules, t, size, e)
        params = {name: param for name, param in model.named_parameters() if strict or name in mine}
        missing = sorted(set(params) - set(mine))
        if missing:
            raise TeAssemblyError(f"the global state has nothing for this rank's parameter(s) {missing}")
        with torch.no_grad():
            for name, param in params.items():
                value = mine[name]
                if tuple(value.shape) != tuple(param.shape):
                    raise TeAssemblyError(
                        f"{name}: this rank's slice has shape {tuple(value.shape)}, the parameter "
                        f"{tuple(param.shape)}"
                    )
                param.copy_(value)

    def gather_global(
        self, tensors: Mapping[str, torch.Tensor], rules: Mapping[str, ParamShard] | None = None
    ) -> dict[str, torch.Tensor] | None:
        """Every rank calls this with its local tensors keyed by *global* key; rank 0 gets the global
        tensors (CPU), the other ranks None. ``rules`` default to the parameters' layouts; a key with
        no rule is taken from rank 0."""
        rules = self.global_rules if rules is None else rules
        mesh = self.mesh
        local = {k: whole(v).detach().to("cpu") for k, v in tensors.items()}
        if mesh is None or mesh.world_size == 1:
            return local
        # Data-parallel replicas hold copies (FSDP2 pieces were made whole above): only data rank 0's
        # pieces travel.
        first = mesh.data_rank == 0 and mesh.shard_rank == 0
        sent = (mesh.expert_rank, mesh.tensor_rank, local) if first else None
        received: list[Any] = [None] * mesh.world_size if mesh.is_main else []
        dist.gather_object(sent, received if mesh.is_main else None, dst=0)
        if not mesh.is_main:
            return None
        pieces = [r for r in received if r is not None]
        out: dict[str, torch.Tensor] = {}
        for key in local:
            rule = rules.get(key, REPLICATED)
            if rule.kind == "tensor":
                parts = sorted((t, held[key]) for e, t, held in pieces if e == 0)
                out[key] = join_slices([p for _, p in parts], rule)
            else:
                out[key] = local[key]
        for _e, _t, held in pieces:  # experts the main rank does not hold
            for key, value in held.items():
                out.setdefault(key, value)
        return {k: out[k] for k in self._ordered(out)}

    def _ordered(self, keys: Mapping[str, Any]) -> list[str]:
        order = {k: i for i, k in enumerate(self.global_rules)}
        return sorted(keys, key=lambda k: (order.get(k.split("/")[0], len(order)), k))

    def optimizer_index(self, model: torch.nn.Module) -> dict[str, int]:
        """Global parameter key -> its index in a single process's optimizer, how every checkpoint keys
        optimizer state so that it moves between layouts. ``model``'s own order (``named_parameters``,
        a tied weight once, at its first name) when every rank holds every parameter or a piece of it;
        with the experts split, the plan's order, which a single process's model follows, with the
        other ranks' experts in place (``tests/engines/test_model_api.py`` checks the two agree). A
        tied weight's two names map to one index."""
        tied = self.plan.tied_params
        mine = [self.local_to_global.get(n, n) for n, p in model.named_parameters() if p.requires_grad]
        if self.settings.expert == 1:
            index = {key: i for i, key in enumerate(mine)}
        else:
            held = set(mine) | {k for k, rule in self.global_rules.items() if rule.kind == "expert"}
            first: dict[str, int] = {}
            index = {
                key: first.setdefault(tied.get(key, key), len(first))
                for key in self.global_rules
                if key in held
            }
        for alias, owner in tied.items():
            if owner in index or alias in index:
                index[alias] = index[owner] = index[owner] if owner in index else index[alias]
        return index

    def global_named(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """``model``'s parameters keyed by global key (for ``gather_global``)."""
        return {self.local_to_global[n]: p for n, p in model.named_parameters()}

    # -------------------------------------------------------------------------------------------- data

    def local_rows(self, t: torch.Tensor, sequence_split: bool = True) -> torch.Tensor:
        """This rank's rows of a global batch tensor: its data/expert shard, and under sequence
        parallelism its tensor rank's part of that (unless ``sequence_split`` is False)."""
        mesh = self.mesh
        if mesh is None:
            return t
        s = self.settings
        per = t.shape[0] // s.data_shards
        rows = t[mesh.shard_index * per : (mesh.shard_index + 1) * per]
        if sequence_split and s.sequence_parallel:
            part = per // s.tensor
            rows = rows[mesh.tensor_rank * part : (mesh.tensor_rank + 1) * part]
        return rows

    def local_inputs(self, inputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """This rank's rows of every public input (cut where it is consumed, see ``layout``)."""
        split = {p.name: p.rows_split for p in self.layout.public_inputs}
        return {k: self.local_rows(v, split.get(k, True)) for k, v in inputs.items()}

    # ---------------------------------------------------------------------------------------- training

    @property
    def is_sharded(self) -> bool:
        """FSDP2 (``parallel.shard``): the model's parameters are ``DTensor`` pieces."""
        return self.mesh is not None and self.settings.is_sharded

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """``model`` in ``DistributedDataParallel`` over the replicas of its non-expert weights (DDP
        averages their gradients during backward); expert weights are left to ``finish_grads``. Under
        ``parallel.shard``, sharded in place by FSDP2 instead (``fsdp.py``): make the optimizer after."""
        mesh = self.mesh
        wrapped = model
        if self.is_sharded and any(p.requires_grad for p in model.parameters()):
            from te_assembly.engines.base import AssembledModel
            from te_assembly.engines.parallel.fsdp import shard_model

            assert isinstance(model, AssembledModel) and mesh is not None
            dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
            wrapped = shard_model(model, mesh, dtype, self.expert_steps())
        elif (
            mesh is not None
            and group_size(mesh.replica_group) > 1
            and any(p.requires_grad for p in model.parameters())
        ):
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            from torch.nn.parallel import DistributedDataParallel

            ignored = [n for n in self._expert_params(model)] if self.settings.expert > 1 else []
            DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, ignored)
            cuda = mesh.device.type == "cuda"
            wrapped = DistributedDataParallel(
                model,
                device_ids=[mesh.device] if cuda else None,
                process_group=mesh.replica_group,
            )

            # No annotations: DDP checks a hook's annotations against its own classes, and this module's
            # postponed (string) annotations never match them.
            def timed_allreduce(group, bucket):  # type: ignore[no-untyped-def]
                start = time.perf_counter()
                future = default_hooks.allreduce_hook(group, bucket)
                if not TIMER.enabled:
                    return future
                return future.then(lambda f: (TIMER.add(start, time.perf_counter()), f.value())[1])

            wrapped.register_comm_hook(mesh.replica_group, timed_allreduce)
        if self.settings.fail_on_rank is not None and self.settings.fail_on_rank == self.rank:
            wrapped.register_forward_pre_hook(_fail(self.rank))
        return wrapped

    def expert_steps(self) -> list[str]:
        """The steps holding experts (``experts`` role) under ``parallel.expert``; none otherwise."""
        if self.settings.expert == 1:
            return []
        return [s.name for s in self.layout.steps if s.expert_role == "experts"]

    def _expert_params(self, model: torch.nn.Module) -> list[str]:
        return [n for n, _ in model.named_parameters() if self._rule(n).kind == "expert"]

    def _rule(self, local_key: str) -> ParamShard:
        return self.global_rules.get(self.local_to_global.get(local_key, ""), REPLICATED)

    def finish_grads(self, model: torch.nn.Module) -> None:
        """After backward (and DDP's averaging): expert gradients averaged over their data-parallel
        replicas and the expert ranks that fed them (FSDP2 does that itself under ``parallel.shard``:
        ``fsdp.py``); under sequence parallelism, the partial gradients of
        unsplit weights summed over the tensor ranks and every gradient divided by their number (each
        rank's loss covered 1/tensor of the rows)."""
        mesh, s = self.mesh, self.settings
        if mesh is None:
            return
        named = [(n, p) for n, p in model.named_parameters() if p.grad is not None]
        if s.expert > 1 and not s.is_sharded:  # FSDP2 reduced them (``fsdp.py``)
            experts = [p for n, p in named if self._rule(n).kind == "expert"]
            reduce_grads(experts, mesh.data_group, 1.0 / s.data_shards)
        if s.sequence_parallel:
            whole = [p for n, p in named if self._rule(n).kind != "tensor"]
            reduce_grads(whole, mesh.tensor_group, 1.0)
            for _, p in named:
                assert p.grad is not None
                p.grad.div_(s.tensor)

    def grad_norm(self, model: torch.nn.Module) -> float:
        """The norm of the whole model's gradient (every parameter counted once, at its global shape),
        on every rank."""
        grads = {self.local_to_global[n]: p.grad for n, p in model.named_parameters() if p.grad is not None}
        gathered = self.gather_global(grads)
        norm = torch.stack([g.double().norm() for g in gathered.values()]).norm().item() if gathered else 0.0
        if self.mesh is None or self.mesh.world_size == 1:
            return norm
        shared = [norm]
        dist.broadcast_object_list(shared, src=0)
        return float(shared[0])

    def norm_of_grads(self, model: torch.nn.Module) -> float:
        """``grad_norm`` with one all-reduce of one number instead of a gather: each rank adds the
        squared norms of its gradients, each weighted by 1 / the number of ranks holding the same slice
        (a replicated parameter is on every rank, a tensor-parallel slice on ``world / tensor``, an
        expert on ``world / expert``, an FSDP2 piece on its mesh's replicas). For every step of a
        training run."""
        world = self.mesh.world_size if self.mesh is not None else 1
        shards = {"tensor": self.settings.tensor, "expert": self.settings.expert}
        parts = [
            local_piece(p.grad).detach().double().square().sum()
            / (holders(p.grad) if is_cut(p.grad) else world / shards.get(self._rule(name).kind, 1))
            for name, p in model.named_parameters()
            if p.grad is not None
        ]
        device = self.mesh.device if self.mesh is not None else torch.device("cpu")
        total = (
            torch.stack(parts).sum().reshape(1).to(device) if parts else torch.zeros(1, dtype=torch.float64)
        )
        if self.mesh is not None and world > 1:
            total = all_reduce(total.to(device), dist.group.WORLD)
        return float(total.item()) ** 0.5

    def all_agree(self, flag: bool) -> bool:
        """Whether ``flag`` holds on every rank (each rank sees only its piece of a sharded gradient)."""
        if self.mesh is None or self.mesh.world_size == 1:
            return flag
        t = torch.tensor([0.0 if flag else 1.0], dtype=torch.float64, device=self.mesh.device)
        return float(all_reduce(t, dist.group.WORLD).item()) == 0.0

    def mean(self, value: float) -> float:
        """The mean of a per-rank number (a loss) over every rank."""
        if self.mesh is None or self.mesh.world_size == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self.mesh.device)
        return float(all_reduce(t, dist.group.WORLD).item()) / self.mesh.world_size

    def from_main(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank (``value`` itself in a single process)."""
        if not self.is_parallel:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.mesh is not None and self.mesh.world_size > 1:
            dist.barrier()


def _local_name(name: str, rule: ParamShard, expert_rank: int, groups: int) -> str | None:
    from te_assembly.analysis.parallel.layout import local_name

    return local_name(name, rule, expert_rank, groups)


def _fail(rank: int) -> Any:
    def hook(module: torch.nn.Module, args: Any) -> None:
        raise InjectedFailure(f"injected failure on rank {rank} (parallel.fail_on_rank={rank})")

    return hook


__all__ = ["ParallelContext", "local_piece"]
