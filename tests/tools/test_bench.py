"""The bench library: the split-in-two-fusers transformation and the plain variant compute exactly what
the channelled model computes (values and gradients); timings are only checked to exist."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from te_assembly.analysis.pipeline import load
from te_assembly.analysis.plan import Plan
from te_assembly.cli.main import main as cli_main
from te_assembly.config import available_models
from te_assembly.engines import build
from te_assembly.engines.data import rows_per_step, sample_public_inputs, sample_x
from te_assembly.engines.target import Target
from te_assembly.jobs.bench import (
    PHASES,
    SplitError,
    SplitModel,
    Stats,
    bench_loss,
    build_variants,
    cut_at,
    forward_flops,
    plan_to_model,
    run_benchmark,
    split_plan,
)
from te_assembly.jobs.bench.runner import Variant
from te_assembly.jobs.bench.split import SplitPlan

CPU = torch.device("cpu")


def _data(plan: Plan, tokens: int, dtype: torch.dtype) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(11)
    # Sequence models (the transformers) get sequences of 8 positions.
    x = sample_x(plan, tokens, generator=g, device=CPU, dtype=dtype, seq_len=8)
    return x, sample_public_inputs(plan, tokens, generator=g, device=CPU, dtype=dtype, seq_len=8)


@pytest.mark.parametrize("model", available_models())
def test_plan_to_model_round_trips(model: str) -> None:
    plan = load(model).checked_plan()
    analysis = load(plan_to_model(plan))
    again = analysis.plan
    assert again is not None, analysis.diagnostics
    assert [
        (s.name, s.type, s.args, s.input_channels, s.output_channels, s.output_public) for s in again.steps
    ] == [(s.name, s.type, s.args, s.input_channels, s.output_channels, s.output_public) for s in plan.steps]
    assert [t.name for t in again.public_inputs] == [t.name for t in plan.public_inputs]
    assert [t.name for t in again.public_outputs] == [t.name for t in plan.public_outputs]


def _float64_variants(plan: Plan) -> tuple[list[Variant], SplitPlan | None]:
    return build_variants(
        plan,
        Target.of("reference", kernels="te", device=CPU, dtype=torch.float64),
        optimizer="sgd",
        lr=0.1,
        compare=True,
    )


@pytest.mark.parametrize("model", available_models())
def test_split_and_plain_variants_match_the_channelled_model(model: str) -> None:
    plan = load(model).checked_plan()
    torch.manual_seed(0)
    variants, split = _float64_variants(plan)
    assert split is not None and len(variants) == 3
    x, inputs = _data(plan, 24, torch.float64)
    outs = []
    for v in variants:
        v.model.zero_grad(set_to_none=True)
        out = v.model(x, **inputs)
        bench_loss(out, v.loss_outputs).backward()
        grads = {n: p.grad for n, p in v.model.named_parameters()}
        outs.append((out, grads))
    (ref, ref_grads), *others = outs
    for out, grads in others:
        torch.testing.assert_close(out.y, ref.y)
        assert list(out.extras) == list(ref.extras)
        for name, value in ref.extras.items():
            torch.testing.assert_close(out.extras[name], value)
        # Parameter names differ only by the part prefix (parts.<k>.) in the split model.
        by_step = {n.split(".", 2)[2] if n.startswith("parts.") else n: g for n, g in grads.items()}
        assert set(by_step) == set(ref_grads)
        for name, g in ref_grads.items():
            if g is None:
                assert by_step[name] is None
            else:
                torch.testing.assert_close(by_step[name], g)


def test_moe_split_bridges_every_crossing_channel() -> None:
    plan = load("moe_block").checked_plan()
    split = split_plan(plan)
    k = split.cut
    assert 0 < k < len(plan.steps)
    crossing = {
        name
        for name, c in plan.channels.items()
        if c.producer.step < k and any(r.step >= k for r in c.consumers)
    }
    assert crossing and {b.channel for b in split.bridges} == crossing
    part1_outputs = {t.name for t in split.part1.public_outputs}
    part2_inputs = {t.name for t in split.part2.public_inputs}
    for b in split.bridges:
        assert b.output in part1_outputs
        consumers = [r for r in plan.channels[b.channel].consumers if r.step >= k]
        assert len(b.inputs) == len(consumers) and set(b.inputs) <= part2_inputs
    # Each part is one fuser of its own: the cut added a fuser boundary, no channel crosses it.
    assert len(split.part1.fusers) == 1 and len(split.part2.fusers) == 1
    assert not set(split.part1.channels) & set(split.part2.channels)
    assert split.part2.in_features == plan.steps[k].in_width


def test_split_model_forward_matches_with_explicit_cut() -> None:
    plan = load("residual_mlp").checked_plan()
    split = split_plan(plan, cut_at(plan, "fc2"))
    assert plan.steps[split.cut].name == "fc2"
    torch.manual_seed(3)
    full = build(plan, Target.of("reference", dtype=torch.float64))
    two = SplitModel(
        split,
        build(split.part1, Target.of("reference", dtype=torch.float64)),
        build(split.part2, Target.of("reference", dtype=torch.float64)),
    )
    two.load_from(full)
    x, _ = _data(plan, 8, torch.float64)
    torch.testing.assert_close(two(x).y, full(x).y)


def test_bad_split_points_are_typed_errors() -> None:
    plan = load("residual_mlp").checked_plan()
    with pytest.raises(SplitError, match="did you mean 'fc1'"):
        cut_at(plan, "fc11")
    with pytest.raises(SplitError, match="first step"):
        cut_at(plan, plan.steps[0].name)


def test_forward_flops_count_gemms_by_rows() -> None:
    plan = load("moe_block").checked_plan()
    tokens = 16
    rows = rows_per_step(plan, tokens)
    expected = 0
    for s in plan.steps:
        if s.type == "GroupedLinear":
            expected += 2 * rows[s.index] * s.args["in_features"] * s.args["out_features"]
        elif s.type == "TopKRouter":
            expected += 2 * tokens * s.args["in_features"] * s.args["num_experts"]
    fc1 = plan.step("fc1")
    assert rows[fc1.index] == tokens * plan.step("router").args["top_k"]
    assert forward_flops(plan, tokens) == expected > 0


def test_run_benchmark_gives_positive_medians() -> None:
    plan = load("moe_block").checked_plan()
    torch.manual_seed(0)
    variants, _ = build_variants(
        plan,
        Target.of("reference", kernels="te", device=CPU, dtype=torch.float32),
        optimizer="adamw",
        lr=1e-3,
        compare=True,
    )
    x, inputs = _data(plan, 16, torch.float32)
    results = run_benchmark(variants, x, inputs, device=CPU, warmup=1, repeats=3)
    assert [r.name for r in results] == [v.name for v in variants]
    for r in results:
        assert set(r.stats) == set(PHASES)
        for s in r.stats.values():
            assert s.n == 3 and 0 < s.min <= s.q1 <= s.median <= s.q3 <= s.max
        assert r.peak_bytes is None  # CPU: no per-phase peak


def test_stats_summary() -> None:
    s = Stats.of([4.0, 1.0, 3.0, 2.0, 5.0])
    assert (s.median, s.q1, s.q3, s.min, s.max, s.n) == (3.0, 2.0, 4.0, 1.0, 5.0, 5)
    with pytest.raises(ValueError):
        Stats.of([])


def test_cli_bench_compare(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    rc = cli_main(
        [
            "bench",
            "model=two_stage",
            "engine=reference",
            "bench.compare=true",
            "bench.tokens=16",
            "bench.warmup=0",
            "bench.repeats=2",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    for name in ("(a) channelled, one fuser", "(b) split, public tensors", "(c) plain PyTorch"):
        assert name in out
    assert "channels passed by the caller: res1 -> add_res1_addend" in out


def test_bench_loss_adds_the_aux_loss_under_any_channel_name() -> None:
    overrides = ["model=moe_block", "model.dims.hidden=16", "model.dims.ffn=8"]
    plan = load(None, [*overrides, "model.ops.2.extra_outputs.aux_loss.channel=balance"]).plan
    assert plan is not None
    torch.manual_seed(0)
    variants, _ = _float64_variants(plan)
    assert [v.loss_outputs for v in variants] == [("balance",)] * 3
    x, inputs = _data(plan, 24, torch.float64)
    out = variants[0].model(x, **inputs)
    expected = out.y.square().mean() + out.extras["balance"]  # float64 stays float64
    torch.testing.assert_close(bench_loss(out, variants[0].loss_outputs), expected)
