"""Bad values on the command line: each is exit 2 (config) or 1 (cannot write) with one clean message,
never a traceback. In-process, so an uncaught exception fails the test outright."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from te_assembly.cli.main import main as cli_main

UNSET = "TE_ASSEMBLY_TEST_UNSET_VARIABLE"


@pytest.fixture(autouse=True)
def _wide(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    monkeypatch.delenv(UNSET, raising=False)


def _err(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    rc = cli_main(list(args))
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
    return rc, captured.err


@pytest.mark.parametrize(
    ("seed", "message"),
    [
        ("abc", "seed must be int, got str ('abc')"),
        ("99999999999999999999999", "seed must be between 0 and 2**63-1, got 99999999999999999999999"),
        ("-1", "seed must be between 0 and 2**63-1, got -1"),
        ("1.5", "seed must be int, got float (1.5)"),
        ("true", "seed must be int, got bool (true)"),
    ],
)
def test_bad_seed_is_a_config_error(capsys: pytest.CaptureFixture[str], seed: str, message: str) -> None:
    rc, err = _err(capsys, "run", "model=channel_demo", f"seed={seed}")
    assert rc == 2
    assert f"error: seed: {message}" in err


def test_largest_seed_runs(capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = _err(capsys, "run", "model=channel_demo", f"seed={2**63 - 1}", "run.steps=1", "run.tokens=4")
    assert rc == 0, err


def test_every_bad_run_setting_is_reported_at_once(capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = _err(capsys, "run", "model=channel_demo", "seed=abc", "dtype=float8", "engine=refrence")
    assert rc == 2
    assert "seed:" in err and "dtype:" in err and "did you mean 'reference'" in err


def test_unresolvable_top_level_value_is_a_config_error(capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = _err(capsys, "run", "model=channel_demo", f"dtype=${{oc.env:{UNSET}}}")
    assert rc == 2
    assert "dtype: cannot resolve value" in err and UNSET in err


def test_unresolvable_value_read_raw_by_a_command_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    # train reads its whole section at once: the entry point's last line of defence reports it.
    rc, err = _err(capsys, "train", "model=channel_demo", f"train.lr=${{oc.env:{UNSET}}}")
    assert rc == 2
    assert "train.lr: cannot resolve value" in err and UNSET in err


@pytest.mark.parametrize(
    ("formats", "expected"),
    [
        ("[pdf]", "graph.formats[0]: formats must be one of mermaid, dot, svg, png, got 'pdf'"),
        ("abc", "graph.formats: formats must be one of mermaid, dot, svg, png, got 'abc'"),
        ("[mermaid,sgv]", "graph.formats[1]: formats must be one of mermaid, dot, svg, png, got 'sgv'"),
    ],
)
def test_unknown_graph_format_lists_the_valid_ones(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, formats: str, expected: str
) -> None:
    rc, err = _err(
        capsys, "graph", "model=two_stage", f"graph.out_dir={tmp_path}", f"graph.formats={formats}"
    )
    assert rc == 2
    assert expected in err
    if "sgv" in formats:
        assert "did you mean 'svg'?" in err
    assert not list(tmp_path.iterdir())


def test_a_single_graph_format_string_is_one_format(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    rc, err = _err(capsys, "graph", "model=two_stage", f"graph.out_dir={tmp_path}", "graph.formats=dot")
    assert rc == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml", "two_stage.dot"]


def _unwritable(tmp_path: Path) -> list[Path]:
    """A regular file, and a directory path beneath a regular file."""
    file = tmp_path / "a_file"
    file.write_text("not a directory")
    return [file, file / "sub"]


def test_graph_out_dir_that_cannot_be_written(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    for out in _unwritable(tmp_path):
        rc, err = _err(capsys, "graph", "model=two_stage", f"graph.out_dir={out}")
        assert rc == 1
        assert f"cannot write to {out}" in err


def test_train_out_dir_that_cannot_be_written(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    for out in _unwritable(tmp_path):
        rc, err = _err(capsys, "train", "model=channel_demo", "train.steps=1", f"train.out_dir={out}")
        assert rc == 1
        assert f"cannot write to {out}" in err


@pytest.mark.parametrize(
    ("split_at", "hint"), [("nope", None), ("rouer", "did you mean 'router'?"), ("residual", None)]
)
def test_bad_bench_split_point_lists_the_steps(
    capsys: pytest.CaptureFixture[str], split_at: str, hint: str | None
) -> None:
    rc, err = _err(capsys, "bench", "model=moe_block", f"bench.split_at={split_at}", "bench.compare=true")
    assert rc == 2
    assert "bench.split_at:" in err
    assert "choose one of norm, router, dispatch, fc1, act, fc2, combine, add_residual" in err
    assert (hint in err) if hint else "did you mean" not in err


def test_bench_threads_beyond_the_cores_is_a_config_error(capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = _err(capsys, "bench", "model=channel_demo", "bench.threads=99999999999999999999")
    assert rc == 2
    assert f"bench.threads: threads must be between 1 and {os.cpu_count()}, got 99999999999999999999" in err
