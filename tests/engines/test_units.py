"""A model run as units (``AssembledModel.configure``): activation checkpointing recomputes block uses
or steps and changes no number; ``compile`` runs the same math compiled; the units are the block uses.
And the config-level rules and memory accounting that go with them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from te_assembly import TrainSettings, load, train
from te_assembly.analysis.parallel.layout import rank_elements, shard_plan, sharded_elements
from te_assembly.analysis.parallel.settings import ParallelSettings
from te_assembly.engines import build
from te_assembly.engines.base import BlockScope
from te_assembly.engines.memory import activation_bytes, rank_estimate, step_activation_bytes, what_would_fit
from te_assembly.engines.target import Target
from te_assembly.errors import ArgumentError, ConfigError

F64 = torch.float64
SMALL = ["model.dims.hidden=32", "model.dims.ffn=64", "model.dims.heads=2"]


def _plan(name: str = "dense_transformer", *extra: str) -> Any:
    return load(name, [*SMALL, *extra] if "transformer" in name else list(extra)).checked_plan()


def _forward_backward(plan: Any, engine: str = "reference", **options: Any) -> tuple[Any, dict[str, Any]]:
    torch.manual_seed(0)
    model = build(plan, Target.of(engine, kernels="reference", dtype=F64))
    if options:
        model.configure(**options)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(2, 16, plan.in_features, dtype=F64, generator=generator)
    y, extras = model(x)
    loss = (y.square() * torch.linspace(0.5, 1.5, y.shape[-1], dtype=F64)).mean()
    for value in extras.values():
        loss = loss + value.sum()
    loss.backward()
    return y.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", ["dense_transformer", "moe_transformer", "residual_mlp"])
@pytest.mark.parametrize("mode", ["blocks", "all"])
def test_activation_checkpointing_changes_no_number(name: str, mode: str) -> None:
    plan = _plan(name)
    y0, g0 = _forward_backward(plan)
    y, g = _forward_backward(plan, activation_checkpointing=mode)
    assert torch.equal(y, y0)
    assert sorted(g) == sorted(g0) and g0
    for key in g0:
        assert torch.equal(g[key], g0[key]), key


def test_checkpointing_recomputes_in_backward() -> None:
    """``blocks`` really recomputes: each block use's forward runs twice (once more in backward)."""
    plan = _plan()
    torch.manual_seed(0)
    model = build(plan, Target.of("reference", dtype=F64))
    model.configure(activation_checkpointing="blocks")
    calls: list[str] = []
    for name in ("layers.0.attn", "layers.1.attn", "head"):
        model.step_module(name).register_forward_hook(lambda *_a, n=name: calls.append(n))
    y, _ = model(torch.randn(2, 16, plan.in_features, dtype=F64))
    y.sum().backward()
    assert sorted(calls) == ["head", "layers.0.attn", "layers.0.attn", "layers.1.attn", "layers.1.attn"]


def test_block_uses_are_the_units_and_keep_parameter_names() -> None:
    plan = _plan()
    torch.manual_seed(0)
    flat = build(plan, Target.of("reference", dtype=F64))
    torch.manual_seed(0)
    model = build(plan, Target.of("reference", dtype=F64))
    model.configure(sharded=True)
    assert model.runs_as_units and not flat.runs_as_units
    units = model.shard_units()
    assert [type(u) for u in units] == [BlockScope, BlockScope]
    assert units[0] is model.step_module("layers.0") and units[1] is model.step_module("layers.1")
    assert list(model.state_dict()) == list(flat.state_dict())
    with pytest.raises(ArgumentError, match="flat program"):
        model.record_channels()


def test_a_tied_weight_stays_with_the_root_unit() -> None:
    """FSDP2 gives every parameter one unit: a block use holding (or tied to) a weight outside it is not
    sharded on its own."""
    plan = load("dense_lm", ["model.dims.layers=2"]).checked_plan()
    assert plan.tied_params
    model = build(plan, "reference")
    model.configure(sharded=True)
    tied = {n.removeprefix("steps.") for pair in plan.tied_params.items() for n in pair}
    for unit in model.shard_units():
        names = {n for n, _ in unit.named_parameters()}
        assert not any(t.split(".", 2)[-1] in names for t in tied if t.startswith(("layers.",)))


@pytest.mark.parametrize(
    ("name", "tolerance"),
    [
        ("residual_mlp", 1e-12),
        # RoPE's tables are float32 (as transformers makes them): inductor fuses their cast differently.
        ("dense_transformer", 1e-5),
    ],
)
def test_compile_runs_the_same_math(name: str, tolerance: float) -> None:
    from torch._dynamo.utils import counters

    plan = _plan(name)
    y0, g0 = _forward_backward(plan)
    counters.clear()
    y, g = _forward_backward(plan, compile=True)
    assert counters["stats"]["unique_graphs"] >= 1  # dynamo traced (and inductor compiled) the units
    torch.testing.assert_close(y, y0, rtol=tolerance, atol=tolerance * 1e-2)
    assert sorted(g) == sorted(g0)
    for key in g0:
        torch.testing.assert_close(g[key], g0[key], rtol=tolerance * 10, atol=tolerance * 1e-2)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the warning is about machines without a GPU")
def test_compile_on_cpu_does_not_warn_of_a_missing_cuda_runtime() -> None:
    """Inductor imports ``torch.utils.cpp_extension``, which logs "No CUDA runtime is found" on a CPU
    machine whose torch is a CUDA build; ``configure(compile=True)`` imports it first, quietly."""
    import subprocess
    import sys

    script = (
        "import sys, te_assembly\n"
        "from te_assembly.engines import build\n"
        "assert 'torch.utils.cpp_extension' not in sys.modules\n"
        "model = build(te_assembly.load('residual_mlp').checked_plan(), 'reference')\n"
        "model.configure(compile=True)\n"
        "assert 'torch.utils.cpp_extension' in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "No CUDA runtime is found" not in done.stdout + done.stderr


@pytest.mark.te
def test_te_engine_checkpoints_each_fuser_and_refuses_compile() -> None:
    pytest.importorskip("transformer_engine.pytorch", reason="needs Transformer Engine")
    plan = _plan()
    y0, g0 = _forward_backward(plan, engine="te")
    y, g = _forward_backward(plan, engine="te", activation_checkpointing="blocks")
    assert torch.equal(y, y0)
    for key in g0:
        assert torch.equal(g[key], g0[key]), key
    model = build(plan, Target.of("te", kernels="reference"))
    with pytest.raises(ArgumentError, match="TE issue #2590"):
        model.configure(compile=True)


def test_training_with_checkpointing_gives_the_plain_run(tmp_path: Path) -> None:
    plan = _plan()
    kw = {"steps": 3, "batch_tokens": 64, "seq_len": 16, "plot": False, "loggers": []}
    plain = train(plan, Target.of("reference", dtype=F64), TrainSettings(out_dir=str(tmp_path / "a"), **kw))
    recomputed = train(
        plan,
        Target.of("reference", dtype=F64),
        TrainSettings(out_dir=str(tmp_path / "b"), activation_checkpointing="blocks", **kw),
    )
    assert recomputed.losses == plain.losses
    assert plain.model is not None and recomputed.model is not None
    for (name, a), (_, b) in zip(
        plain.model.state_dict().items(), recomputed.model.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name


# ------------------------------------------------------------------------------------ config and memory


def _diagnostics(overrides: list[str], name: str = "dense_transformer") -> list[Any]:
    return list(load(name, [*SMALL, *overrides]).diagnostics)


@pytest.mark.parametrize(
    ("overrides", "path", "words"),
    [
        (["parallel.shard=2", "parallel.tensor=2"], "parallel.shard", "cannot be combined yet"),
        (["engine=te", "parallel.shard=2", "parallel.expert=2"], "parallel.shard", "FSDP2 unit of its own"),
        (["engine=te", "compile=true"], "compile", "TE issue #2590"),
        (["engine=te", "recipe=fp8_current", "parallel.shard=2"], "parallel.shard", "TE issue #2713"),
        (["parallel.shard=0"], "parallel.shard", ""),
    ],
)
def test_config_refusals(overrides: list[str], path: str, words: str) -> None:
    errors = [d for d in _diagnostics(overrides) if d.is_error]
    assert any(d.path == path and words in d.message for d in errors), [d.format() for d in errors]


def test_expert_parallelism_shards_with_the_reference_engine() -> None:
    overrides = ["parallel.shard=2", "parallel.expert=2", "parallel.data=2"]
    assert not [d.format() for d in load("moe_block", overrides).diagnostics if d.is_error]


def test_auto_engine_choosing_te_refuses_sharded_experts() -> None:
    from te_assembly.engines.target import Target

    plan = load("moe_block").checked_plan()
    target = Target("te", reason="engine=te: Transformer Engine and a CUDA GPU are present")
    with (
        pytest.raises(ConfigError, match=r"engine=auto chose te .*FSDP2 unit of its own"),
        target.distributed(
            plan, ParallelSettings(shard=2, expert=2), command="run", tokens=("run.tokens", 64)
        ),
    ):
        pass


def test_sharded_expert_layout_counts_pieces() -> None:
    """Experts are cut across the shard ranks of their expert rank, everything else across the shard and
    expert ranks together: each of the 4 ranks holds a quarter of this model."""
    plan = load("moe_block").checked_plan()
    layout, diags = shard_plan(plan, ParallelSettings(shard=2, expert=2))
    assert layout is not None, diags
    for expert_rank in (0, 1):
        expected = 0
        for step in plan.steps:
            groups = int(step.args.get("num_groups") or 0)
            for name, shape in step.param_shapes.items():
                if step.type != "GroupedLinear":
                    expected += sharded_elements(tuple(shape), 4)
                elif (
                    expert_rank * groups // 2
                    <= int(name.removeprefix("weight").removeprefix("bias"))
                    < (expert_rank + 1) * groups // 2
                ):
                    expected += sharded_elements(tuple(shape), 2)
        assert rank_elements(plan, layout, expert_rank) == expected
    assert rank_elements(plan, layout) * 4 == pytest.approx(plan.num_params, rel=0.01)


def test_memory_refusal_of_an_expert_parallel_run_suggests_sharding() -> None:
    plan = load("moe_block").checked_plan()
    experts, _ = shard_plan(plan, ParallelSettings(expert=2))
    both, _ = shard_plan(plan, ParallelSettings(expert=2, shard=2))
    assert experts is not None and both is not None
    kw: dict[str, Any] = {"tokens": 64, "trained": 1, "optimizer": "adamw"}
    alone = rank_estimate(plan, experts, torch.float32, **kw)
    sharded = rank_estimate(plan, both, torch.float32, **kw)
    assert sharded.optimizer == pytest.approx(alone.optimizer / 2, rel=0.02)
    budget = (alone.total + sharded.total) // 2
    assert sharded.total <= budget < alone.total
    fixes = what_would_fit(plan, experts, torch.float32, budget, **kw)
    assert fixes[0] == "parallel.shard=2 (torchrun --nproc_per_node=4)"


def test_sharded_layout_counts_pieces() -> None:
    plan = _plan()
    layout, diags = shard_plan(plan, ParallelSettings(shard=2))
    assert layout is not None, diags
    assert ParallelSettings(shard=2, data=3).world_size == 6
    assert ParallelSettings(shard=2, data=3).data_shards == 6
    assert (
        sharded_elements((5, 3), 2) == 9 and sharded_elements((4,), 4) == 1 and sharded_elements((), 8) == 1
    )
    expected = sum(sharded_elements(shape, 2) for step in plan.steps for shape in step.param_shapes.values())
    assert rank_elements(plan, layout) == expected


def test_memory_estimate_accounts_for_sharding_and_checkpointing() -> None:
    plan = _plan("dense_transformer", "model.dims.layers=4")
    single, _ = shard_plan(plan, ParallelSettings())
    sharded, _ = shard_plan(plan, ParallelSettings(shard=4))
    assert single is not None and sharded is not None
    kw: dict[str, Any] = {"tokens": 256, "trained": 1, "optimizer": "adamw", "seq_len": 32}
    one = rank_estimate(plan, single, torch.float32, **kw)
    four = rank_estimate(plan, sharded, torch.float32, **kw)
    layer = sum(plan.steps[i].num_params for i in plan.blocks[0].uses[0].steps) * 4
    assert four.optimizer == pytest.approx(one.optimizer / 4, rel=0.01)
    # Each rank keeps its quarter, plus the largest unit gathered whole while it runs.
    assert four.parameters == rank_elements(plan, sharded) * 4 + layer
    # The TE engine is one unit: the whole model is gathered at once.
    te = rank_estimate(plan, sharded, torch.float32, one_unit=True, **kw)
    assert te.parameters == rank_elements(plan, sharded) * 4 + plan.num_params * 4
    assert four.activations == one.activations / 4
    # blocks: each use keeps its input; backward recomputes one use at a time. x and y are kept.
    per_step = step_activation_bytes(plan, 256, torch.float32, 32)
    uses = [u.steps for u in plan.blocks[0].uses]
    inside = {i for u in uses for i in u}
    expected = 256 * (plan.in_features + plan.out_features) * 4
    expected += sum(b for i, b in enumerate(per_step) if i not in inside)
    expected += sum(256 * plan.steps[u[0]].in_width * 4 for u in uses)
    expected += max(sum(per_step[i] for i in u) for u in uses)
    assert activation_bytes(plan, 256, torch.float32, 32, checkpointing="blocks") == expected
    assert expected < activation_bytes(plan, 256, torch.float32, 32)
    # What would fit: between the four-way and the single-process footprint, shard=4 and not 2.
    budget = (rank_estimate(plan, sharded, torch.float32, **kw).total + one.total) // 2
    two, _ = shard_plan(plan, ParallelSettings(shard=2))
    assert two is not None
    fits_two = rank_estimate(plan, two, torch.float32, **kw).total <= budget
    fixes = what_would_fit(plan, single, torch.float32, budget, **kw)
    assert (
        fixes[0]
        == f"parallel.shard={2 if fits_two else 4} (torchrun --nproc_per_node={2 if fits_two else 4})"
    )


def test_train_refuses_with_the_fix_that_fits(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    plan = _plan()
    settings = TrainSettings(out_dir=str(tmp_path / "run"), steps=1, batch_tokens=512, seq_len=16)
    from te_assembly.engines.target import Target
    from te_assembly.errors import ResourceError

    single, _ = shard_plan(plan, ParallelSettings())
    assert single is not None
    kw: dict[str, Any] = {"tokens": 512, "models": 2, "trained": 1, "optimizer": "adamw", "seq_len": 16}
    fused = Target("reference").fused_attention  # what the train job estimates the reference engine with
    need = rank_estimate(plan, single, torch.float32, fused_attention=fused, **kw).total
    monkeypatch.setenv("TE_ASSEMBLY_MEMORY_LIMIT", str(need - 1))
    with pytest.raises(
        ResourceError, match=r"it fits with parallel\.shard=2 \(torchrun --nproc_per_node=2\)"
    ):
        train(plan, Target("reference"), settings)
    assert not (tmp_path / "run").exists()


def test_compile_with_auto_engine_choosing_te_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from te_assembly.engines import target as target_module

    monkeypatch.setattr(target_module, "resolve_engine", lambda engine, kernels: ("te", "TE imports"))
    with pytest.raises(ConfigError, match="TE issue #2590"):
        target_module.Target.of("auto", compile=True)
