"""A settings value given on the command line is reported at the key's line in the config file (where
its default lives) and names the override that set it, so the reader is not sent to a line holding a
valid default."""

from __future__ import annotations

from te_assembly.analysis.pipeline import load


def test_a_bad_override_names_itself() -> None:
    analysis = load("moe_block", ["engine=tee", "run.steps=0"])
    by_path = {d.path: d for d in analysis.errors}
    assert set(by_path) == {"engine", "run.steps"}
    assert by_path["engine"].override == "engine=tee"
    assert by_path["run.steps"].override == "run.steps=0"
    text = by_path["engine"].format()
    assert text.startswith(f"{by_path['engine'].file}:{by_path['engine'].line}: error: engine: ")
    assert text.endswith("[set on the command line: engine=tee]")


def test_the_last_override_of_a_key_is_the_one_named() -> None:
    analysis = load("moe_block", ["engine=te", "engine=tee"])
    (only,) = analysis.errors
    assert only.override == "engine=tee"


def test_values_from_files_and_model_overrides_name_no_override() -> None:
    # A model override's error sits where the value is used (the interpolation site in the model file).
    analysis = load("moe_block", ["model.dims.top_k=9", "seed=3"])
    assert analysis.errors and all(d.override is None for d in analysis.errors)
    assert all(d.file is not None and d.file.endswith("moe_block.yaml") for d in analysis.errors)


def test_validate_checks_every_section_a_later_command_reads(run_cli) -> None:  # type: ignore[no-untyped-def]
    done = run_cli(["validate", "model=moe_block", "train.lr=nan", "bench.repeats=0", "graph.formats=[pdf]"])
    assert done.returncode == 2, done.stderr
    for path in ("train.lr:", "bench.repeats:", "graph.formats[0]:"):
        assert f"error: {path}" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
