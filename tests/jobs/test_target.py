"""The runtime target and what every job shares through it: one optimizer for train and bench, one
objective, one weight copy, one way to build and sample; and the CLI's numbers are the jobs' numbers."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from rich.console import Console

import te_assembly
from te_assembly.analysis.settings import RunSettings
from te_assembly.cli.commands import run as run_command
from te_assembly.engines.data import sample_public_inputs, sample_x
from te_assembly.engines.target import NO_RECIPE, Target
from te_assembly.engines.weights import copy_weights
from te_assembly.errors import ArgumentError, ConfigError, VerificationError
from te_assembly.jobs import objective
from te_assembly.jobs.bench.job import bench
from te_assembly.jobs.bench.settings import BenchSettings
from te_assembly.jobs.bench.variants import PLAIN, SPLIT, build_variants
from te_assembly.jobs.events import Advanced, Built
from te_assembly.jobs.optimizer import NothingToStep, OptimizerSpec, make_optimizer
from te_assembly.jobs.run import run
from te_assembly.jobs.train.schedule import make_optimizer as train_optimizer
from te_assembly.jobs.train.settings import TrainSettings

F64 = torch.float64
CPU = torch.device("cpu")


def _plan(name: str = "moe_block", *overrides: str) -> te_assembly.analysis.plan.Plan:  # type: ignore[name-defined]
    return te_assembly.load(name, list(overrides)).checked_plan()


def test_target_of_checks_and_resolves_its_values() -> None:
    target = Target.of("auto", dtype=F64, seed=4)
    assert target.engine == "reference"  # no CUDA GPU here, whatever TE is
    assert target.reason.startswith("engine=reference: no ")
    assert (target.device, target.dtype, target.seed, target.recipe) == (CPU, F64, 4, NO_RECIPE)
    assert target.engine_recipe is None and not target.is_parallel
    with pytest.raises(ArgumentError, match="dtype must be a floating-point"):
        Target.of("reference", dtype=torch.int64)
    with pytest.raises(ConfigError, match="config error"):
        Target.of("tee")
    with pytest.raises(ConfigError, match="invalid quantization recipe"):
        Target.of("reference", recipe={"kind": "DelayedScaling", "fp8_format": "HYBRD"})
    quantized = Target.of("te", kernels="reference", recipe={"kind": "DelayedScaling"})
    assert quantized.engine_recipe is quantized.recipe and quantized.recipe.kind == "DelayedScaling"


def test_target_build_seeds_the_weights_and_sample_is_the_data_module() -> None:
    plan = _plan("two_stage")
    target = Target("reference", dtype=F64, seed=9)
    a, b = target.build(plan, seed=9), target.build(plan, seed=9)
    other = target.build(plan, seed=10)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert not all(torch.equal(p, q) for p, q in zip(a.parameters(), other.parameters(), strict=True))
    x, inputs = target.sample(plan, 16, torch.Generator().manual_seed(2), seq_len=4)
    g = torch.Generator().manual_seed(2)
    assert torch.equal(x, sample_x(plan, 16, generator=g, device=CPU, dtype=F64, seq_len=4))
    want = sample_public_inputs(plan, 16, generator=g, device=CPU, dtype=F64, seq_len=4)
    assert inputs.keys() == want.keys() and all(torch.equal(inputs[k], want[k]) for k in want)


def test_train_and_bench_step_with_the_same_optimizer() -> None:
    plan = _plan("residual_mlp")
    variants, _ = build_variants(plan, Target("reference"), optimizer="adamw", lr=0.01, compare=True)
    trained = train_optimizer(te_assembly.build(plan, "reference").parameters(), TrainSettings(lr=0.01))
    defaults = {k: v for k, v in trained.defaults.items() if k != "lr"}
    for variant in variants:
        assert type(variant.optimizer) is type(trained)
        assert {k: v for k, v in variant.optimizer.defaults.items() if k != "lr"} == defaults
        assert variant.optimizer.defaults["lr"] == 0.01
    assert {v.name for v in variants} >= {SPLIT, PLAIN}
    sgd = make_optimizer(te_assembly.build(plan, "reference").parameters(), OptimizerSpec("sgd", 0.1))
    assert isinstance(sgd, torch.optim.SGD) and sgd.defaults["momentum"] == TrainSettings().momentum
    assert isinstance(make_optimizer([], OptimizerSpec()), NothingToStep)
    with pytest.raises(ValueError, match="unknown optimizer 'lion'"):
        make_optimizer(te_assembly.build(plan, "reference").parameters(), OptimizerSpec("lion"))


def test_objective_terms_in_order_and_their_total() -> None:
    y = torch.tensor([[1.0, 3.0]])
    target = torch.tensor([[0.0, 1.0]])
    extras = {"tap": torch.tensor([2.0, 4.0]), "balance": torch.tensor(0.5), "map": torch.tensor([1, 2])}
    terms = objective.loss_terms(y, extras, ["balance"], target=target, other_outputs=True)
    assert list(terms) == [objective.TEACHER_MSE, "tap", "balance"]
    assert [t.item() for t in terms.values()] == [2.5, 10.0, 0.5]
    assert objective.total(terms).item() == 13.0
    plain = objective.loss_terms(y, extras, ["balance"])
    assert list(plain) == [objective.MEAN_SQUARE, "balance"] and plain[objective.MEAN_SQUARE].item() == 5.0


def test_copy_weights_is_strict_about_names() -> None:
    plan = _plan("residual_mlp")
    source = te_assembly.build(plan, Target.of("reference", dtype=F64))
    target = te_assembly.build(plan, Target.of("reference", dtype=F64))
    with torch.no_grad():
        for p in source.parameters():
            p.normal_()
    copy_weights(source, target)
    assert all(torch.equal(p, q) for p, q in zip(source.parameters(), target.parameters(), strict=True))
    smaller = te_assembly.build(_plan("two_stage"), Target.of("reference", dtype=F64))
    with pytest.raises(VerificationError, match="parameter names differ"):
        copy_weights(source, smaller)


def test_run_reports_its_events_in_order() -> None:
    events: list[object] = []
    result = run(
        _plan(), Target("reference", seed=1), RunSettings(steps=3, tokens=32), on_event=events.append
    )
    assert isinstance(events[0], Built) and events[0].model.engine == "reference"
    progress = [e for e in events if isinstance(e, Advanced)]
    assert [(e.done, e.total) for e in progress] == [(1, 3), (2, 3), (3, 3)]
    assert progress[-1].description.endswith(f"loss {result.loss:.4g}")
    assert result.channel_grads is not None and {c.name for c in result.channel_grads} >= {"aux_loss"}


def test_the_cli_prints_the_run_jobs_numbers() -> None:
    overrides = [
        "model=moe_block",
        "engine=reference",
        "dtype=float64",
        "seed=5",
        "run.steps=2",
        "run.tokens=32",
    ]
    buffer = io.StringIO()
    console = Console(file=buffer, width=300, no_color=True, highlight=False)
    analysis = te_assembly.load(None, overrides, sections=run_command.SECTIONS)
    assert run_command.main(analysis, console) == 0
    result = run(analysis.checked_plan(), Target("reference", dtype=F64, seed=5), RunSettings(2, 32))
    line = next(x for x in buffer.getvalue().splitlines() if x.startswith("engine reference: loss"))
    assert f"loss {result.loss:.6g}, parameter-gradient norm {result.grad_norm:.6g}" in line


def test_bench_job_returns_data_and_prints_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    result = bench(_plan("residual_mlp"), Target("reference"), BenchSettings(tokens=64, warmup=0, repeats=2))
    assert capsys.readouterr().out == ""
    assert [r.name for r in result.results] == ["residual_mlp"]
    assert set(result.report) >= {"model", "variants", "flops", "job"}
    assert result.report["variants"][0]["phases"].keys() == {"forward", "backward", "step"}


def test_python_api_names_resolve_without_torch() -> None:
    code = (
        "import sys, te_assembly\n"
        "assert 'torch' not in sys.modules\n"
        "names = ('run', 'verify', 'train', 'bench', 'Target')\n"
        "print(sorted(n for n in names if n in te_assembly.__all__))\n"
        "assert 'torch' not in sys.modules\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=Path("/")
    )
    assert out.stdout.strip() == "['Target', 'bench', 'run', 'train', 'verify']"
    assert te_assembly.train.__module__ == "te_assembly.jobs.train.job"
    assert te_assembly.Target is Target
