"""Pass 1: a YAML file read and parsed once into plain data, with a line map and every problem that
plain data cannot hold, each with file and line; hostile files refused quickly."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from te_assembly.config import source
from te_assembly.config.source import parse_text, read_bytes, read_file


def _codes(src: source.Source) -> list[tuple[str, int | None]]:
    return [(d.code, d.line) for d in src.diagnostics]


def test_plain_data_matches_pyyaml_and_hydra_scalars() -> None:
    text = (
        "a: 1e3\nb: 0x10\nc: 017\nd: 1_000\ne: 2024-01-01\nf: yes\ng: ~\nh: '12'\ni: -2.5\n"
        "j: .inf\nk: on_x\nl: [1, two, {x: null}]\n"
    )
    src = parse_text(text, "s.yaml", "model", "model")
    assert src.diagnostics == ()
    # Hydra's loader: ``1e3`` is a float, dates stay strings; the rest is YAML 1.1 as PyYAML reads it.
    assert src.data == {
        "a": 1000.0,
        "b": 16,
        "c": 15,
        "d": 1000,
        "e": "2024-01-01",
        "f": True,
        "g": None,
        "h": "12",
        "i": -2.5,
        "j": math.inf,
        "k": "on_x",
        "l": [1, "two", {"x": None}],
    }
    generated = yaml.safe_dump({"ops": [{"name": f"s{i}", "args": {"size": i}} for i in range(50)]})
    assert parse_text(generated, "g.yaml", "model", "model").data == yaml.safe_load(generated)


def test_line_map_names_the_nearest_key_the_file_has() -> None:
    text = "name: m\nops:\n  - name: a\n    args:\n      size: 8\n  - name: b\n"
    lines = parse_text(text, "m.yaml", "model", "model").lines
    assert lines.line("model.ops[0].args.size") == 5
    assert lines.line("model.ops.0.args.size") == 5  # override spelling
    assert lines.line("model.ops[1]") == 6
    assert lines.line("model.ops[1].args.missing") == 6  # nearest enclosing key the YAML names
    assert lines.line("model.nope") == 1
    assert lines.line("recipe.kind") is None  # another file's key


def test_interpolation_sites_are_noted_while_parsing() -> None:
    text = "a: ${model.dims.x}\nb: [plain, '${mul:2,3}']\nc: {d: x}\n"
    assert parse_text(text, "i.yaml", "model", "model").interpolations == (("a",), ("b", 1))


def test_duplicate_keys_are_errors_at_the_second_one() -> None:
    src = parse_text("a: 1\nb:\n  c: 1\n  c: 2\na: 3\n", "d.yaml", "model", "model")
    assert _codes(src) == [("duplicate-key", 4), ("duplicate-key", 5)]
    assert [d.path for d in src.diagnostics] == ["model.b.c", "model.a"]
    assert "first at line 3" in src.diagnostics[0].message


def test_tags_that_would_build_objects_are_refused() -> None:
    src = parse_text("a: !!python/object/apply:os.system [ls]\nb: !custom x\n", "t.yaml", "model", "model")
    assert _codes(src) == [("yaml-tag", 1), ("yaml-tag", 2)]
    assert all("never Python objects" in d.message for d in src.diagnostics)


def test_merge_keys_merge_and_explicit_keys_win() -> None:
    src = parse_text("base: &b {x: 1, y: 2}\nc:\n  <<: *b\n  y: 3\n", "m.yaml", "model", "model")
    assert src.data["c"] == {"x": 1, "y": 3}


def test_syntax_error_has_its_line() -> None:
    src = parse_text("a: 1\nb: [1, 2\nc: 3\n", "s.yaml", "model", "model")
    assert [(d.code, d.file) for d in src.diagnostics] == [("yaml-syntax", "s.yaml")]
    assert src.diagnostics[0].line in (2, 3) and src.data is None


def test_billion_laughs_is_refused_quickly() -> None:
    rows = ["a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    for name, prev in zip("bcdefghi", "abcdefgh", strict=True):
        rows.append(f"{name}: &{name} [{', '.join(['*' + prev] * 10)}]")
    # 10**9 values once expanded: building them would never end; the expansion is counted instead.
    src = parse_text("\n".join(rows) + "\n", "laughs.yaml", "model", "model")
    assert _codes(src) == [("yaml-aliases", 1)] and src.data is None


def test_a_few_aliases_are_fine() -> None:
    src = parse_text(
        "x: &x {size: 8}\nops: [{name: a, args: *x}, {name: b, args: *x}]\n", "a.yaml", "model", "model"
    )
    assert src.diagnostics == () and src.data["ops"][1]["args"] == {"size": 8}


@pytest.mark.parametrize("depth", [source.MAX_DEPTH + 5, 200, 5000])
def test_deep_nesting_is_refused(depth: int) -> None:
    src = parse_text("a: " + "[" * depth + "]" * depth + "\n", "deep.yaml", "model", "model")
    assert [d.code for d in src.diagnostics][:1] in (["too-deep"], ["yaml-syntax"])
    assert src.diagnostics[0].line == 1
    assert "nested" in src.diagnostics[0].message


def test_nesting_within_the_limit_is_fine() -> None:
    depth = source.MAX_DEPTH - 2
    src = parse_text("a: " + "[" * depth + "]" * depth + "\n", "ok.yaml", "model", "model")
    assert src.diagnostics == ()


def test_non_utf8_is_refused_with_its_line() -> None:
    src = read_bytes(b"name: m\nin_features: 8\ndescription: caf\xe9\n", "latin1.yaml", "model", "model")
    assert _codes(src) == [("bad-encoding", 3)]
    assert "0xe9" in src.diagnostics[0].message


def test_large_files_are_refused_before_parsing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(source, "MAX_BYTES", 1000)
    path = tmp_path / "big.yaml"
    path.write_text("a: " + "x" * 2000 + "\n")
    src = read_file(path, "model", "model")
    assert [d.code for d in src.diagnostics] == ["file-too-large"]
    assert "limited to" in src.diagnostics[0].message


def test_a_directory_or_fifo_is_not_read(tmp_path: Path) -> None:
    import os

    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    for path in (tmp_path, fifo, tmp_path / "missing.yaml"):
        src = read_file(path, "model", "model")  # a FIFO would block a plain open(): never opened
        assert [d.code for d in src.diagnostics] == ["no-such-file"], path


def test_integer_literal_beyond_pythons_digit_limit_is_one_error() -> None:
    src = parse_text("a: " + "9" * 5000 + "\n", "n.yaml", "model", "model")
    assert [d.code for d in src.diagnostics] == ["bad-number"]


def test_a_recursive_alias_is_refused_with_its_line(tmp_path: Path) -> None:
    from te_assembly.analysis.pipeline import load

    path = tmp_path / "rec.yaml"
    path.write_text("name: rec\nin_features: 8\nops: &o\n  - name: a\n    op: Identity\n  - *o\n")
    found = load(path).diagnostics
    assert [(d.code, d.line) for d in found] == [("yaml-aliases", 3)]
    assert "an alias refers to a node that contains it" in found[0].message


def test_a_mapping_that_contains_itself_is_a_config_error() -> None:
    import te_assembly
    from te_assembly.errors import ConfigError

    model: dict[str, Any] = {"name": "selfref", "in_features": 8, "ops": []}
    model["ops"].append(model)
    with pytest.raises(ConfigError) as info:
        te_assembly.build(model, "reference")
    assert [(d.code, d.path) for d in info.value.diagnostics] == [("recursive-structure", "model.ops[0]")]
    dims: dict[str, Any] = {}
    dims["me"] = dims
    found = te_assembly.validate_model({"name": "d", "in_features": 8, "dims": dims, "ops": []})
    assert [(d.code, d.path) for d in found] == [("recursive-structure", "model.dims.me")]
