"""The one path sanitiser: a name that becomes a file name stays one name in the folder it is written
to, whatever the name holds. Property tests over any text, and the surface that takes a name from a
user (``import_hf.name``) refusing a path at config time, with nothing written anywhere."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from te_assembly.errors import ArgumentError
from te_assembly.files.names import MAX_NAME_BYTES, as_file_name, name_problem, safe_name
from te_assembly.formats.hf.convert import model_name
from tests.hostile.conftest import clean_failure, tree, user_cli

HOSTILE = [
    "../../evil",
    "..",
    ".",
    "a/b",
    "/abs",
    "a\\b",
    "x\0y",
    "",
    "-rf",
    ".hidden",
    "a\nb",
    " pad",
    "é" * 150,
]


@pytest.mark.parametrize("name", HOSTILE)
def test_a_name_that_is_no_plain_name_is_refused(name: str) -> None:
    assert name_problem(name) is not None
    with pytest.raises(ArgumentError, match="cannot be a file name"):
        safe_name(name, "import_hf.name")


@given(st.text(max_size=300))
def test_an_accepted_name_is_exactly_one_entry_of_its_folder(name: str) -> None:
    if name_problem(name) is not None:
        return
    folder = Path("/srv/dest")
    joined = folder / name
    assert joined.parent == folder and joined.name == name
    assert len(name.encode("utf-8")) <= MAX_NAME_BYTES


@given(st.text(max_size=600), st.sampled_from(["model", "imported"]))
def test_a_derived_name_always_passes_the_sanitiser(text: str, fallback: str) -> None:
    name = as_file_name(text, fallback)
    assert name_problem(name) is None, (text, name)
    assert (Path("/srv") / name).parent == Path("/srv")


@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=80))
def test_a_model_name_from_any_folder_name_is_safe(text: str) -> None:
    if not text or "/" in text or "\0" in text or text in (".", ".."):
        return
    name = model_name(Path("/srv") / text)
    assert name_problem(name) is None, (text, name)


def test_import_hf_name_with_a_path_is_refused_at_config_time_and_writes_nothing(
    tmp_path: Path, hf_llama: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    before = tree(tmp_path)
    done = user_cli(work, "import-hf", str(hf_llama), "dest", "import_hf.name=../../evil")
    clean_failure(done, 2, "import_hf.name", "cannot be a file name")
    assert tree(tmp_path) == before
    assert not list(tmp_path.parent.glob("evil*"))


def test_a_shipped_name_is_never_shadowed_by_its_copy(tmp_path: Path) -> None:
    done = user_cli(tmp_path, "cp", "moe_block", "mine")
    assert done.returncode == 0, done.stderr
    copy = tmp_path / "mine" / "model" / "my_moe_block.yaml"
    assert copy.is_file() and "name: my_moe_block" in copy.read_text()
    assert "-cd mine model=my_moe_block" in done.stdout
    checked = user_cli(tmp_path, "validate", "-cd", "mine", "model=my_moe_block")
    assert checked.returncode == 0 and str(copy) in checked.stdout, checked.stdout + checked.stderr
