"""Multi-process test worlds: N CPU processes in a gloo process group, and the in-process checks they run.

``spawn_world(n, fn, *args)`` starts ``fn(rank, *args)`` in ``n`` fresh processes (spawned, so each has
its own torch), joined to one gloo group, and fails the calling test with the first rank's traceback;
it never waits longer than ``timeout`` seconds. ``fn`` must live in an importable module (this one).

The equality checks compare a parallel model with the single-process model on the same weights and the
same global batch, in float64: every rank builds both. The objective is the mean over the batch's row
shards of each shard's loss, so that is what the single process differentiates.
"""

from __future__ import annotations

import datetime
import os
import socket
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from te_assembly.analysis.parallel.layout import shard_plan
from te_assembly.analysis.parallel.settings import ParallelSettings
from te_assembly.analysis.plan import Plan
from te_assembly.engines import build
from te_assembly.engines.base import AssembledModel, loss_output_names
from te_assembly.engines.data import sample_public_inputs, sample_x
from te_assembly.engines.parallel.context import ParallelContext
from te_assembly.engines.parallel.mesh import build_mesh
from te_assembly.engines.target import Target

F64 = torch.float64
TOL = {"rtol": 1e-10, "atol": 1e-12}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _entry(
    rank: int, world: int, port: int, backend: str, fn: Callable[..., None], args: tuple[Any, ...]
) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
    )
    torch.set_num_threads(1)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=60))
    try:
        fn(rank, *args)
    finally:
        dist.destroy_process_group()


def spawn_world(
    world: int, fn: Callable[..., None], *args: Any, timeout: float = 180, backend: str = "gloo"
) -> None:
    context = mp.start_processes(
        _entry, args=(world, free_port(), backend, fn, args), nprocs=world, start_method="spawn", join=False
    )
    deadline = time.monotonic() + timeout
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            raise TimeoutError(f"a {world}-process world did not finish within {timeout} s")


# ------------------------------------------------------------------------------------------ the checks


def make_context(plan: Plan, settings: ParallelSettings) -> ParallelContext:
    layout, diags = shard_plan(plan, settings)
    assert layout is not None, [d.format() for d in diags]
    return ParallelContext(plan, layout, build_mesh(settings, torch.device("cpu")))


def shard_loss(y: torch.Tensor, extras: dict[str, torch.Tensor], loss_names: tuple[str, ...]) -> torch.Tensor:
    """A loss every output's gradient flows from, with per-row weights so no symmetry hides a mistake."""
    weights = torch.linspace(0.5, 1.5, y.shape[-1], dtype=y.dtype)
    loss = (y.square() * weights).mean()
    for name, value in extras.items():
        if value.is_floating_point():
            loss = loss + (value.sum() if name in loss_names else value.square().mean())
    return loss


def single_process_reference(
    plan: Plan,
    model: AssembledModel,
    x: torch.Tensor,
    inputs: dict[str, torch.Tensor],
    ctx: ParallelContext,
    shards: list[tuple[torch.Tensor, dict[str, torch.Tensor]]],
) -> tuple[list[Any], torch.Tensor]:
    """The single-process model on every shard; returns each shard's (y, extras) and d objective / d x."""
    names = loss_output_names(plan)
    x = x.clone().requires_grad_(True)
    outs, total = [], x.new_zeros(())
    for rows, shard_inputs in shards:
        y, extras = model(x[rows], **shard_inputs)
        outs.append((y, extras))
        total = total + shard_loss(y, extras, names)
    (total / len(shards)).backward()
    assert x.grad is not None
    return outs, x.grad


def row_shards(n: int, settings: ParallelSettings) -> list[slice]:
    count = settings.row_shards
    per = n // count
    return [slice(i * per, (i + 1) * per) for i in range(count)]


def my_shard(ctx: ParallelContext) -> int:
    mesh, s = ctx.mesh, ctx.settings
    assert mesh is not None
    if s.sequence_parallel:
        return mesh.shard_index * s.tensor + mesh.tensor_rank
    return mesh.shard_index


def check_equal_to_single_process(
    rank: int,
    plan: Plan,
    sizes: dict[str, int],
    tokens: int,
    engine: str = "reference",
    kernels: str = "te",
    prepare: Callable[[AssembledModel], None] | None = None,
    x_transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
    dtype: torch.dtype = F64,
    tolerance: dict[str, float] | None = None,
    device: str = "cpu",
) -> None:
    """Outputs, public extras, the input gradient and every parameter gradient of the parallel model
    equal the single-process model's on the same weights and rows. ``device``: where the parallel model
    runs (the single-process reference stays on the CPU)."""
    tol = TOL if tolerance is None else tolerance
    settings = ParallelSettings(**sizes)
    dev = torch.device(device, dist.get_rank()) if device == "cuda" else torch.device(device)
    layout, diags = shard_plan(plan, settings)
    assert layout is not None, [d.format() for d in diags]
    ctx = ParallelContext(plan, layout, build_mesh(settings, dev))
    torch.manual_seed(0)
    single = build(plan, Target.of("reference", dtype=dtype))
    if prepare is not None:
        prepare(single)
    torch.manual_seed(0)
    local = build(plan, Target.of(engine, kernels=kernels, dtype=dtype, parallel=ctx, device=dev))
    ctx.load_global(local, single.state_dict())  # ``prepare`` may have changed the single model's weights
    wrapped = ctx.wrap(local)

    generator = torch.Generator().manual_seed(1)
    x = sample_x(plan, tokens, generator=generator, device=torch.device("cpu"), dtype=dtype)
    if x_transform is not None:
        x = x_transform(x)
    inputs = sample_public_inputs(plan, tokens, generator=generator, device=torch.device("cpu"), dtype=dtype)
    cuts = row_shards(tokens, settings)
    shards = [(rows, {k: v[rows] for k, v in inputs.items()}) for rows in cuts]
    expected, x_grad = single_process_reference(plan, single, x, inputs, ctx, shards)

    mine = my_shard(ctx)
    x_local = ctx.local_rows(x).to(dev).requires_grad_(True)
    y, extras = wrapped(x_local, **{k: v.to(dev) for k, v in ctx.local_inputs(inputs).items()})
    shard_loss(y, extras, loss_output_names(plan)).backward()
    ctx.finish_grads(local)
    # Every collective before any assertion: a rank that fails must not leave the others waiting.
    grads = ctx.gather_global({ctx.local_to_global[n]: p.grad for n, p in local.named_parameters()})
    weights = ctx.gather_global(ctx.global_named(local))
    y, extras = y.cpu(), {k: v.cpu() for k, v in extras.items()}

    y_expected, extras_expected = expected[mine]
    torch.testing.assert_close(y, y_expected, **tol, msg=lambda m: f"rank {rank}: y differs: {m}")
    assert set(extras) == set(extras_expected)
    for name, value in extras.items():
        torch.testing.assert_close(
            value, extras_expected[name], **tol, msg=lambda m, n=name: f"rank {rank}: extra {n}: {m}"
        )
    # Each rank's input gradient is of its own shard's loss; the objective averages the shards.
    assert x_local.grad is not None
    torch.testing.assert_close(
        x_local.grad.cpu() / len(cuts), x_grad[cuts[mine]], **tol, msg=lambda m: f"rank {rank}: dx: {m}"
    )
    if ctx.is_main:
        assert grads is not None and weights is not None
        expected_params = dict(single.named_parameters())
        assert list(grads) == list(expected_params), (list(grads), list(expected_params))
        for name, param in expected_params.items():
            torch.testing.assert_close(weights[name], param.detach(), **tol)
            assert param.grad is not None
            torch.testing.assert_close(grads[name], param.grad, **tol, msg=lambda m, n=name: f"grad {n}: {m}")


# ------------------------------------------------------------------------------------- models and cases


def shipped(name: str, **dims: int) -> Plan:
    """A shipped model with some dims changed (small sizes keep the worlds fast)."""
    from te_assembly import load

    return load(name, [f"model.dims.{k}={v}" for k, v in dims.items()]).checked_plan()


def inline(text: str) -> Plan:
    import textwrap

    import yaml

    from te_assembly import load

    return load(yaml.safe_load(textwrap.dedent(text))).checked_plan()


def randomize(model: AssembledModel) -> None:
    """Every parameter drawn afresh (biases start at zero and norm scales at one: that would hide a bias
    applied twice or a scale left out)."""
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator, dtype=p.dtype) * 0.5)


def starve_last_expert(model: AssembledModel) -> None:
    """Randomize, then make the router never pick the last expert for positive inputs (an expert with
    no tokens on any rank)."""
    randomize(model)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("router.weight"):
                p[-1] = -5.0


def positive(x: torch.Tensor) -> torch.Tensor:
    return x.abs() + 0.1


def run_cases(rank: int, cases: list[tuple[str, Callable[[], Plan], dict[str, int], dict[str, Any]]]) -> None:
    """Run every case; fail with all the failing cases' names and first lines (this rank's view)."""
    failures = []
    for name, make_plan, sizes, options in cases:
        try:
            check_equal_to_single_process(rank, make_plan(), sizes, **options)
        except Exception as exc:
            failures.append(f"{name}: {type(exc).__name__}: {str(exc).strip().splitlines()[0][:400]}")
        dist.barrier()
    if failures:
        raise AssertionError(f"rank {rank}: " + "\n".join(failures))


def check_te_kernel_ops_are_split(rank: int) -> None:
    """TE's own ops (built on CPU, never called: their GEMMs need a GPU) get TE's tensor-parallel
    arguments and this rank's slices: BasicLinear with ``tensor_parallel_mode`` and the group, a sliced
    Bias after a column split, a whole one after a row split."""
    import transformer_engine.pytorch.ops as te_ops

    plan = shipped("residual_mlp", hidden=8, ffn=16)
    ctx = make_context(plan, ParallelSettings(tensor=2))
    cpu = torch.device("cpu")
    fc1 = ctx.te_op(plan.step("fc1"), "te", cpu, torch.float32)
    fc2 = ctx.te_op(plan.step("fc2"), "te", cpu, torch.float32)
    assert isinstance(fc1, te_ops.FusedOperation) and isinstance(fc2, te_ops.FusedOperation)
    col, col_bias = fc1.basic_ops
    row, row_bias = fc2.basic_ops
    assert isinstance(col, te_ops.BasicLinear) and isinstance(row, te_ops.BasicLinear)
    assert (col.tensor_parallel_mode, col.tensor_parallel_size) == ("column", 2)
    assert (row.tensor_parallel_mode, row.tensor_parallel_size) == ("row", 2)
    assert col.tensor_parallel_group is ctx.mesh.tensor_group  # type: ignore[union-attr]
    assert tuple(col.weight.shape) == (16, 8) and tuple(col_bias.bias.shape) == (16,)  # 32 -> 16 each
    assert tuple(row.weight.shape) == (8, 8) and tuple(row_bias.bias.shape) == (8,)  # in 16 -> 8; bias whole
    assert not row_bias.tensor_parallel
    # The rest of the model is TE's single-process ops; load this rank's slices and compare.
    module = torch.nn.Module()
    module.fc1, module.fc2 = fc1, fc2
    torch.manual_seed(0)
    single = build(plan, Target.of("reference", dtype=torch.float32))
    randomize(single)
    state = {
        k.removeprefix("steps."): v for k, v in single.state_dict().items() if ".fc1." in k or ".fc2." in k
    }
    from te_assembly.engines.parallel.sharding import take_slice

    rules = {k.removeprefix("steps."): r for k, r in ctx.global_rules.items()}
    for name, param in module.named_parameters():
        with torch.no_grad():
            param.copy_(take_slice(state[name], rules[name], rank, 2))
    half = slice(rank * 8, rank * 8 + 8)
    w1 = state["fc1.basic_ops.0.weight"]
    torch.testing.assert_close(col.weight, torch.cat([w1[:16][half], w1[16:][half]]))
    torch.testing.assert_close(row.weight, state["fc2.basic_ops.0.weight"][:, half])

    # Expert parallelism: TE's GroupedLinear holds this rank's experts only (2 of 4), named from 0.
    moe = shipped("moe_block", hidden=8, ffn=8)
    experts = make_context(moe, ParallelSettings(expert=2))
    fc1_moe = experts.te_op(moe.step("fc1"), "te", cpu, torch.float32)
    assert isinstance(fc1_moe, te_ops.GroupedLinear) and fc1_moe.num_groups == 2
    assert {k for k, _ in fc1_moe.named_parameters()} == {"weight0", "weight1", "bias0", "bias1"}
    assert experts.local_to_global["steps.fc1.weight1"] == f"steps.fc1.weight{2 * rank + 1}"
