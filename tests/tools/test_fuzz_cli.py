"""Fuzzing loading and validation through the command line's own entry point (in process, so any
uncaught exception fails the test): whatever the model file or the overrides hold, ``validate`` exits
0 or 2 with a message, never with a traceback."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from te_assembly.cli.main import main as cli_main
from tests.validation.test_invalid_corpus import BASE

pytestmark = pytest.mark.tools  # their own tier (pyproject.toml), run by CI after the multi-process one

REPO_ROOT = Path(__file__).resolve().parents[2]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(
        ["${model.dims.hidden}", "${mul:abc,3}", "${model.nope}", "${oc.env:NOPE}", "\x1b[2J", "x"]
    ),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
KEY_PATHS = [
    ("name",),
    ("in_features",),
    ("dims",),
    ("ops",),
    ("ops", 0),
    ("ops", 1, "op"),
    ("ops", 1, "args"),
    ("ops", 2, "args", "top_k"),
    ("ops", 3, "extra_inputs"),
    ("ops", 4, "extra_inputs", "split_sizes"),
    ("ops", 2, "extra_outputs", "probs"),
    ("ops", 8, "name"),
]


def _mutate(model: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    """``model`` with ``value`` at ``path``; unchanged when an earlier edit removed the path."""
    out = copy.deepcopy(model)
    node: Any = out
    for key in path[:-1]:
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            return out
    last = path[-1]
    if isinstance(node, dict) or (isinstance(node, list) and isinstance(last, int) and last < len(node)):
        node[last] = value
    return out


@pytest.fixture(autouse=True)
def _wide(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    monkeypatch.delenv("NOPE", raising=False)


def _validate(capsys: pytest.CaptureFixture[str], *args: str) -> int:
    code = cli_main(["validate", *args])
    captured = capsys.readouterr()
    assert code in (0, 2), (code, captured.err[-2000:])
    assert "Traceback" not in captured.out + captured.err
    if code == 2:
        assert captured.err.strip(), "exit 2 must say why"
    return code


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.tuples(st.sampled_from(KEY_PATHS), values), min_size=1, max_size=3))
def test_mutated_model_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], edits: list[tuple[tuple[Any, ...], Any]]
) -> None:
    model: dict[str, Any] = copy.deepcopy(BASE)
    for path, value in edits:
        model = _mutate(model, path, value)
    file = tmp_path / "fuzz.yaml"
    file.write_text(yaml.safe_dump(model, allow_unicode=True))
    _validate(capsys, f"model={file}")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    text=st.text(
        alphabet=st.sampled_from(list("abc:-[]{}&*!|>'\"#%@`,?\n\t 01.~$\\\x00\x1b\xe9")), max_size=80
    )
)
def test_arbitrary_yaml_text(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str) -> None:
    file = tmp_path / "text.yaml"
    file.write_bytes(text.encode("utf-8", "surrogatepass"))
    _validate(capsys, f"model={file}")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    key=st.sampled_from(
        [
            "model.dims.hidden",
            "model.ops.4.args.num_groups",
            "seed",
            "engine",
            "run.steps",
            "recipe",
            "model",
            "+model.x",
            "~model.dims",
            "recipe.margin",
            "train.lr",
            "dtype",
            "device",
            "hydra.verbose",
        ]
    ),
    value=st.one_of(
        st.sampled_from(
            [
                "null",
                "nan",
                "inf",
                "1e400",
                "-1",
                "99999999999999999999",
                "[1,2",
                "{a: 1}",
                "${x}",
                "${mul:a,1}",
                "mps",
                "cuda:7",
                "'\\x1b'",
                "",
                "a,b",
                "int(3)",
                "range(2)",
            ]
        ),
        st.text(alphabet=st.sampled_from(list("abcxyz019._-/=,[]{}$:")), max_size=10),
    ),
)
def test_arbitrary_overrides(capsys: pytest.CaptureFixture[str], key: str, value: str) -> None:
    _validate(capsys, "model=channel_demo", f"{key}={value}" if not key.startswith("~") else key)


@pytest.mark.parametrize(
    "text",
    [
        "- just\n- a list\n",
        "a: " + "[" * 3000 + "]" * 3000 + "\n",
        "name: x\nin_features: 8\nops: []\nname: y\n",
        "\ufeffname: bom\nin_features: 8\nops: [{name: a, op: Identity}]\n",
    ],
    ids=["top-level-list", "nested-3000-deep", "duplicate-key", "byte-order-mark"],
)
def test_hostile_files_through_a_real_process(tmp_path: Path, text: str) -> None:
    file = tmp_path / "hostile.yaml"
    file.write_text(text)
    env = {**os.environ, "COLUMNS": "400", "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "te_assembly", "validate", f"model={file}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode in (0, 2) and "Traceback" not in done.stderr, done.stderr
    if "bom" not in text:
        assert done.returncode == 2 and f"{file}:" in done.stderr


# --- interpolation strings and Hydra settings -----------------------------------------------------

_LEAVES = st.sampled_from(
    ["${model.dims.hidden}", "${model.dims.a}", "${model.dims.b}", "${model.nope}", "3", "x", "", "${", "}"]
)


def _interpolations() -> st.SearchStrategy[str]:
    """Strings of te_assembly's interpolation grammar, nested and concatenated: references, the mul and
    add resolvers, resolvers that must be refused, unbalanced braces."""
    return st.recursive(
        _LEAVES,
        lambda inner: st.one_of(
            st.tuples(
                st.sampled_from(["mul", "add", "oc.env", "oc.decode", "oc.create", "nope"]), inner, inner
            ).map(lambda t: f"${{{t[0]}:{t[1]},{t[2]}}}"),
            st.tuples(inner, inner).map(lambda t: t[0] + t[1]),
        ),
        max_leaves=8,
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    a=_interpolations(),
    b=_interpolations(),
    where=st.sampled_from(
        [("dims", "a"), ("ops", 1, "args", "normalized_shape"), ("in_features",), ("name",)]
    ),
    value=_interpolations(),
)
def test_interpolation_strings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], a: str, b: str, where: tuple[Any, ...], value: str
) -> None:
    model: dict[str, Any] = copy.deepcopy(BASE)
    model["dims"] = {**model.get("dims", {}), "a": a, "b": b}
    model = _mutate(model, where, value)
    file = tmp_path / "interp.yaml"
    file.write_text(yaml.safe_dump(model, allow_unicode=True))
    _validate(capsys, f"model={file}")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    key=st.sampled_from(
        [
            "hydra.run.dir",
            "hydra.sweep.dir",
            "hydra.job.chdir",
            "hydra.output_subdir",
            "hydra.verbose",
            "hydra.job.name",
            "+hydra.callbacks.x._target_",
            "hydra/job_logging",
            "hydra/hydra_logging",
            "+hydra.job_logging.handlers.f.filename",
            "hydra.mode",
        ]
    ),
    value=st.one_of(
        st.sampled_from(
            ["null", "true", "RUN", "disabled", "default", "builtins.open", "${now:%H}", "/", "."]
        ),
        st.text(alphabet=st.sampled_from(list("abc/._-${}:")), max_size=12),
    ),
)
def test_hydra_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], key: str, value: str
) -> None:
    """validate writes nothing and runs no code whatever Hydra is told: exit 0 or 2, never a traceback,
    and the folder it runs in stays empty."""
    monkeypatch.chdir(tmp_path)
    _validate(capsys, "model=channel_demo", f"{key}={value}")
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


@pytest.mark.parametrize("command", ["validate", "explain", "run"])
def test_hydra_default_log_file_is_not_written_by_commands_that_write_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """``hydra/job_logging=default`` adds a log file in the run directory, which is the current folder for
    a command that writes nothing: the file is left out there (found by ``test_hydra_settings``), and kept
    where a run directory is made (``graph``)."""
    monkeypatch.chdir(tmp_path)
    extra = ["run.steps=1"] if command == "run" else []
    assert cli_main([command, "model=residual_mlp", "hydra/job_logging=default", *extra]) == 0
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]
    assert cli_main(["graph", "model=residual_mlp", "hydra/job_logging=default", "hydra.run.dir=g"]) == 0
    assert (tmp_path / "g" / "graph.log").is_file()
    capsys.readouterr()
