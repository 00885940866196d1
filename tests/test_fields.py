"""One field checker for every config value: a kind of mistake has one code and one wording whether it
is made in a step's args, a recipe, the top-level settings or a run/train/bench/graph section."""

from __future__ import annotations

import re

import pytest

from te_assembly.analysis.parallel.settings import ParallelSettings
from te_assembly.analysis.pipeline import load
from te_assembly.analysis.settings import CommonSettings, RunSettings
from te_assembly.jobs.bench.settings import BenchSettings
from te_assembly.jobs.train.settings import TrainSettings
from te_assembly.views.graph import GraphSettings

SECTIONS = {
    "": CommonSettings,
    "run": RunSettings,
    "train": TrainSettings,
    "bench": BenchSettings,
    "parallel": ParallelSettings,
}
SECTIONS_WITH_GRAPH = {**SECTIONS, "graph": GraphSettings}


def _only(model: str, override: str, path: str) -> tuple[str, str]:
    analysis = load(model, [override], sections=SECTIONS_WITH_GRAPH)
    found = [d for d in analysis.errors if d.path == path]
    assert len(analysis.errors) == 1 and found, [d.format() for d in analysis.diagnostics]
    assert found[0].file is not None and found[0].line is not None  # located in its file
    return found[0].code, found[0].message


# (model, override, key path, the value's name in the message)
NOT_POSITIVE = [
    ("moe_block", "run.steps=0", "run.steps", "steps"),
    ("moe_block", "train.batch_tokens=0", "train.batch_tokens", "batch_tokens"),
    ("moe_block", "bench.tokens=0", "bench.tokens", "tokens"),
    ("moe_block", "parallel.expert=0", "parallel.expert", "expert"),
    ("moe_block", "model.ops.3.args.top_k=0", "model.ops[3].args.top_k", "top_k"),
]
WRONG_TYPE = [
    ("moe_block", "seed=abc", "seed", "seed", "int"),
    ("moe_block", "train.lr=abc", "train.lr", "lr", "float"),
    ("moe_block", "bench.repeats=abc", "bench.repeats", "repeats", "int"),
    ("moe_block", "parallel.timeout_s=abc", "parallel.timeout_s", "timeout_s", "float"),
    (
        "moe_block",
        "model.ops.1.args.normalized_shape=abc",
        "model.ops[1].args.normalized_shape",
        "normalized_shape",
        "int",
    ),
]
BAD_CHOICE = [
    ("moe_block", "engine=tee", "engine", "engine"),
    ("moe_block", "device=mps", "device", "device"),
    ("moe_block", "train.optimizer=adam", "train.optimizer", "optimizer"),
    ("moe_block", "parallel.backend=mpi", "parallel.backend", "backend"),
    ("moe_block", "graph.formats=pdf", "graph.formats", "formats"),
    (
        "moe_block",
        "+model.ops.2.args.score_function=softmx",
        "model.ops[2].args.score_function",
        "score_function",
    ),
]
NOT_FINITE = [
    ("moe_block", "train.lr=nan", "train.lr", "lr", ".nan"),
    ("moe_block", "train.momentum=inf", "train.momentum", "momentum", ".inf"),
    ("moe_block", "train.weight_decay=nan", "train.weight_decay", "weight_decay", ".nan"),
    ("moe_block", "train.min_lr_ratio=inf", "train.min_lr_ratio", "min_lr_ratio", ".inf"),
    ("moe_block", "bench.lr=nan", "bench.lr", "lr", ".nan"),
    ("moe_block", "parallel.timeout_s=inf", "parallel.timeout_s", "timeout_s", ".inf"),
    ("channel_demo", "model.ops.2.args.scale=nan", "model.ops[2].args.scale", "scale", ".nan"),
    ("channel_demo", "model.ops.2.args.scale=-inf", "model.ops[2].args.scale", "scale", "-.inf"),
]


@pytest.mark.parametrize(("model", "override", "path", "name"), NOT_POSITIVE)
def test_not_positive_is_one_code_one_wording(model: str, override: str, path: str, name: str) -> None:
    assert _only(model, override, path) == ("out-of-range", f"{name} must be positive, got 0")


def test_a_recipe_field_out_of_range_reads_the_same() -> None:
    analysis = load("moe_block", ["recipe=fp8_delayed", "recipe.amax_history_len=0"])
    [d] = analysis.errors
    assert (d.path, d.code, d.message) == (
        "recipe.amax_history_len",
        "out-of-range",
        "amax_history_len must be positive, got 0",
    )
    assert d.file is not None and d.file.endswith("fp8_delayed.yaml")


@pytest.mark.parametrize(("model", "override", "path", "name", "type_name"), WRONG_TYPE)
def test_wrong_type_is_one_code_one_wording(
    model: str, override: str, path: str, name: str, type_name: str
) -> None:
    assert _only(model, override, path) == ("wrong-type", f"{name} must be {type_name}, got str ('abc')")


@pytest.mark.parametrize(("model", "override", "path", "name"), BAD_CHOICE)
def test_bad_choice_is_one_code_one_wording(model: str, override: str, path: str, name: str) -> None:
    code, message = _only(model, override, path)
    assert code == "bad-choice"
    assert re.fullmatch(rf"{name} must be one of [\w:, ]+, got '\w+'", message), message


@pytest.mark.parametrize(("model", "override", "path", "name", "shown"), NOT_FINITE)
def test_non_finite_numbers_are_refused(model: str, override: str, path: str, name: str, shown: str) -> None:
    assert _only(model, override, path) == ("not-finite", f"{name} must be a finite number, got {shown}")


@pytest.mark.parametrize(
    ("override", "path"),
    [
        ("seed=99999999999999999999", "seed"),
        ("run.tokens=99999999999999999999", "run.tokens"),
        ("model.dims.hidden=99999999999999999999", "model.in_features"),
    ],
)
def test_integers_beyond_64_bits_are_out_of_range(override: str, path: str) -> None:
    analysis = load("residual_mlp", [override])
    found = [d for d in analysis.errors if d.path == path]
    assert found and found[0].code == "out-of-range", [d.format() for d in analysis.diagnostics]
    assert "2**63-1" in found[0].message


def test_unknown_settings_keys_have_one_code() -> None:
    analysis = load(
        "moe_block", ["+train.lrr=0.1", "+bench.tokenz=4", "+parallel.expertz=2"], sections=SECTIONS
    )
    assert sorted((d.path, d.code, d.hint) for d in analysis.errors) == [
        ("bench.tokenz", "unknown-key", "did you mean 'tokens'?"),
        ("parallel.expertz", "unknown-key", "did you mean 'expert'?"),
        ("train.lrr", "unknown-key", "did you mean 'lr'?"),
    ]
