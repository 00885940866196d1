"""Property tests of the readers every surface shares: the JSON reader takes any text to a value or an
``InputFileError`` (never another exception, never a different value than the JSON says), the YAML
config reader takes any text to a source with its findings (never an exception), and the bounded reader
never returns more than its limit."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from te_assembly.config.source import parse_text
from te_assembly.files.read import InputFileError, parse_json, read_bytes

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4),
    max_leaves=30,
)


@given(st.text(max_size=400))
def test_any_text_is_json_or_a_named_refusal(text: str) -> None:
    try:
        parse_json(text, "x.json")
    except InputFileError as exc:
        assert exc.path == "x.json" and exc.code in ("bad-json", "too-deep")


@given(JSON_VALUES)
def test_json_reads_back_what_was_written(value: object) -> None:
    assert parse_json(json.dumps(value), "x.json") == value


@given(st.integers(min_value=1, max_value=3000))
def test_nesting_past_the_limit_is_refused_at_any_depth(depth: int) -> None:
    text = "[" * depth + "]" * depth
    try:
        parse_json(text, "x.json", max_depth=100)
        assert depth <= 100
    except InputFileError as exc:
        assert depth > 100 and exc.code == "too-deep"


@given(st.text(max_size=400))
def test_any_text_is_a_config_or_its_findings(text: str) -> None:
    """Any text parses to data or to findings; nothing at all only for a document that holds nothing
    (empty, blank, only comments, or a null: what the loader then reports as an empty file)."""
    source = parse_text(text, "m.yaml", "model", "model")
    if source.data is None and not source.diagnostics:
        assert yaml.safe_load(text) is None, text


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=30)
@given(st.binary(max_size=300), st.integers(min_value=0, max_value=200))
def test_the_reader_never_returns_more_than_its_limit(content: bytes, limit: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "f"
        path.write_bytes(content)
        try:
            assert read_bytes(path, limit=limit) == content and len(content) <= limit
        except InputFileError as exc:
            assert len(content) > limit and exc.code == "file-too-large"
