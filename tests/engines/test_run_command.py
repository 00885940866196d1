"""The main job (``python -m te_assembly [run]``): end to end, and its pieces in-process."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from rich.console import Console

from te_assembly.analysis.pipeline import load
from te_assembly.cli.commands import run as run_command
from te_assembly.engines import build, resolve_engine
from te_assembly.engines.data import sample_public_inputs, split_sizes
from te_assembly.engines.reference.model import ReferenceModel
from te_assembly.engines.target import Target
from te_assembly.jobs import run
from tests.engines._helpers import plan_from_yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")


def _run_in_process(*overrides: str) -> str:
    buffer = io.StringIO()
    console = Console(file=buffer, width=400, no_color=True, highlight=False)
    assert run_command.main(load(None, list(overrides), sections=run_command.SECTIONS), console) == 0
    return buffer.getvalue()


def test_run_moe_block_end_to_end(run_cli: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    done = run_cli(["model=moe_block", "engine=reference", "run.steps=2", "run.tokens=32"])
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "engine=reference (asked for)" in out
    table = out[out.index("gradient reaching each channel") :]
    plan = load("moe_block").checked_plan()
    for name in plan.channels:
        assert re.search(rf"│ {name}\s", table), f"channel {name} missing from the gradient table"
    assert "split_sizes" in table and "fc1.split_sizes, fc2.split_sizes" in table  # the fan-out consumers
    assert re.search(r"step time \d+\.\d+ ms \(1 timed step after a warm-up step\)", out)


def test_auto_engine_prints_its_reason() -> None:
    engine, reason = resolve_engine("auto")
    out = _run_in_process("model=channel_demo", "engine=auto", "run.steps=1", "run.tokens=4")
    assert out.splitlines()[0] == reason
    assert f"engine {engine}:" in out


def test_engine_te_without_te_is_a_clear_error(tmp_path: Path) -> None:
    # Shadow transformer_engine with a package that fails to import, as a broken or absent install does.
    fake = tmp_path / "transformer_engine"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('transformer_engine is not installed here')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "COLUMNS": "400", "NO_COLOR": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "te_assembly", "model=moe_block", "engine=te", "run.steps=1", "run.tokens=8"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "engine=te needs Transformer Engine" in done.stderr
    assert "Traceback" not in done.stderr


def test_recipe_is_reported_as_ignored_by_the_reference_engine() -> None:
    args = ("model=channel_demo", "engine=reference", "run.steps=1", "run.tokens=4")
    out = _run_in_process(*args, "recipe=mxfp8")
    assert "recipe mxfp8 ignored by the reference engine" in out
    plain = _run_in_process(*args)
    assert "ignored" not in plain


@pytest.mark.te
def test_a_recipe_that_quantizes_nothing_is_not_called_a_recipe() -> None:
    """The default recipe (bf16, kind none) on a float32 run: 'recipe bf16' would read as bf16 math."""
    args = ("model=channel_demo", "engine=te", "kernels=reference", "run.steps=1", "run.tokens=4")
    out = _run_in_process(*args)
    assert "kernels reference, no quantization recipe" in out and "recipe bf16" not in out


def test_same_seed_same_run_other_seed_other_run() -> None:
    args = ("model=two_stage", "engine=reference", "run.steps=2", "run.tokens=16")

    def summary(text: str) -> str:
        return re.sub(r"step time .*", "", text[text.index("outputs (last step)") :])

    first, again = summary(_run_in_process(*args, "seed=3")), summary(_run_in_process(*args, "seed=3"))
    other = summary(_run_in_process(*args, "seed=4"))
    assert first == again
    assert first != other


def test_bad_run_values_are_config_errors() -> None:
    from te_assembly.errors import ConfigError

    with pytest.raises(ConfigError, match=r"run\.steps: steps must be positive, got 0"):
        _run_in_process("model=channel_demo", "run.steps=0")
    with pytest.raises(
        ConfigError, match="dtype: dtype must be one of float32, float64, bfloat16, got 'float8'"
    ):
        _run_in_process("model=channel_demo", "dtype=float8")


def test_channel_gradients_are_the_sum_over_consumers_and_caller() -> None:
    # loss = mean(y^2) + aux_loss and y = experts(x) + residual, so d loss / d residual = 2 y / numel
    # and d loss / d aux_loss = 1.
    plan = load("moe_block", ["model.dims.hidden=16", "model.dims.ffn=8"]).checked_plan()
    torch.manual_seed(0)
    model = build(plan, Target.of("reference", dtype=torch.float64))
    assert isinstance(model, ReferenceModel)
    model.record_channels()
    results = run.run_steps(
        model, plan, Target(model.engine, seed=0, device=CPU, dtype=torch.float64), steps=2, tokens=24
    )
    y = results[-1].y
    grads = model.channel_grads()
    torch.testing.assert_close(grads["residual"], 2 * y / y.numel())
    torch.testing.assert_close(grads["aux_loss"], torch.tensor(1.0, dtype=torch.float64))
    assert grads["routing_map"] is None and grads["split_sizes"] is None
    assert results[-1].loss == pytest.approx(
        (y.square().mean() + results[-1].extras["aux_loss"]).item(), rel=1e-12
    )
    assert run.parameter_grad_norm(model) > 0


def test_loss_adds_aux_losses_as_is_and_squares_other_outputs() -> None:
    y = torch.tensor([[1.0, 3.0]])
    extras = {
        "router_aux_loss": torch.tensor(0.25),
        "tap": torch.tensor([2.0, 4.0]),
        "routing_map": torch.tensor([7, 8]),
    }
    assert run.loss_of(y, extras, ["router_aux_loss"]).item() == pytest.approx(5.0 + 0.25 + 10.0)
    # A scalar output that is not a loss slot is squared like any other output.
    assert run.loss_of(y, extras, []).item() == pytest.approx(5.0 + 0.0625 + 10.0)


def test_renamed_aux_loss_channel_is_still_added_as_is() -> None:
    overrides = ["model=moe_block", "model.dims.hidden=16", "model.dims.ffn=8"]
    plan = load(None, [*overrides, "model.ops.2.extra_outputs.aux_loss.channel=balance"]).checked_plan()
    torch.manual_seed(0)
    model = build(plan, Target.of("reference", dtype=torch.float64))
    assert model.loss_output_names == ("balance",)
    result = run.run_steps(
        model, plan, Target(model.engine, seed=0, device=CPU, dtype=torch.float64), steps=1, tokens=24
    )[-1]
    balance = result.extras["balance"]
    assert result.loss == pytest.approx((result.y.square().mean() + balance).item(), rel=1e-12)
    assert balance.item() != pytest.approx(balance.square().item())  # added, not squared


def test_median_step_time_leaves_out_the_first_step() -> None:
    y = torch.zeros(1)
    results = [run.StepResult(y, {}, 0.0, s) for s in (9.0, 1.0, 3.0, 2.0)]
    assert run.median_step_time(results) == 2.0
    assert run.median_step_time(results[:1]) == 9.0


@pytest.mark.parametrize(
    ("steps", "note"),
    [
        (1, "(1 step, warm-up included)"),
        (2, "(1 timed step after a warm-up step)"),
        (3, "(median of 2 timed steps after a warm-up step)"),
    ],
)
def test_step_time_says_how_many_steps_it_timed(steps: int, note: str) -> None:
    out = _run_in_process("model=residual_mlp", "engine=reference", f"run.steps={steps}", "run.tokens=8")
    line = next(line for line in out.splitlines() if "step time" in line)
    assert line.endswith(f" ms {note}"), line
    assert "median of 1" not in out


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


def test_sample_public_inputs_fit_their_slots() -> None:
    plan = plan_from_yaml(SAMPLED)
    tokens = 10
    gen = torch.Generator().manual_seed(0)
    inputs = sample_public_inputs(plan, tokens, generator=gen, device=CPU, dtype=torch.float64)
    assert list(inputs) == [t.name for t in plan.public_inputs]
    assert inputs["add_addend"].shape == (tokens, 6) and inputs["add_addend"].dtype == torch.float64
    assert inputs["dispatch_probs"].shape == (tokens, 2)
    torch.testing.assert_close(inputs["dispatch_probs"].sum(-1), torch.ones(tokens, dtype=torch.float64))
    routing = inputs["dispatch_routing_map"]
    assert routing.dtype == torch.int64 and routing.min() >= 0 and routing.max() < 3
    assert all(len(set(row.tolist())) == 2 for row in routing)
    sizes = inputs["fc_split_sizes"]
    assert sizes.dtype == torch.int64 and sizes.shape == (3,) and sizes.sum().item() == 2 * tokens
    assert inputs["fc_scales"].shape == (2 * tokens,)
    assert sorted(inputs["combine_row_map"].tolist()) == list(range(2 * tokens))
    # The samples are accepted by the ops they feed.
    torch.manual_seed(0)
    model = build(plan, Target.of("reference", dtype=torch.float64))
    y, _ = model(torch.randn(tokens, 6, dtype=torch.float64), **inputs)
    assert y.shape == (tokens, 4)


def test_public_inputs_behind_an_aligned_dispatch_cannot_be_sampled() -> None:
    # With align > 1 the rows between Dispatch and Combine depend on the routing: no fixed-size sample
    # can fit them, so sampling says so instead of producing tensors the ops would reject.
    plan = plan_from_yaml(
        SAMPLED.replace("args: {num_experts: 3, top_k: 2}", "args: {num_experts: 3, top_k: 2, align: 4}")
    )
    with pytest.raises(ValueError, match=r"'fc_split_sizes'.*align > 1.*feed it from a channel"):
        sample_public_inputs(plan, 10, generator=torch.Generator(), device=CPU, dtype=torch.float64)


@pytest.mark.parametrize("rows, groups", [(0, 3), (1, 4), (37, 5)])
def test_split_sizes_sum_to_rows(rows: int, groups: int) -> None:
    sizes = split_sizes(rows, groups, torch.Generator().manual_seed(rows))
    assert sizes.shape == (groups,) and sizes.min() >= 0 and sizes.sum().item() == rows


def test_run_explains_vanishing_gradients_behind_a_final_norm() -> None:
    """mean(y^2) of a normalised y barely depends on its input: run says so, instead of leaving tiny
    gradient norms to read as broken gradient flow; a model whose last step is not a norm gets no note."""
    from te_assembly.analysis.pipeline import load
    from te_assembly.cli.commands.run import _normalised_output_note

    model = {
        "name": "normend",
        "in_features": 8,
        "ops": [
            {"name": "fc", "op": "Linear", "args": {"in_features": 8, "out_features": 8}},
            {"name": "final_norm", "op": "RMSNorm", "args": {"normalized_shape": 8}},
        ],
    }
    note = _normalised_output_note(load(model).checked_plan())
    assert note is not None and "final_norm" in note and "mean(y^2)" in note
    assert _normalised_output_note(load("moe_block").checked_plan()) is None
