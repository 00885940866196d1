"""``ls`` and ``cp`` through the command line: what is listed comes from the catalog and the config
folders (shipped and the user's), and ``cp`` never overwrites."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from te_assembly.catalog import MODULE_ALLOWLIST, OPS
from te_assembly.config import configs_dir
from te_assembly.config.locations import recipes_dir
from te_assembly.views.op_sheet import default_text as _default
from tests.tools.test_run_outputs import user_cli

RunCli = Callable[..., subprocess.CompletedProcess[str]]


def _row(*cells: str) -> str:
    """A regex for a table row holding these cells in order."""
    return r"│ " + r"\s+│ ".join(re.escape(c) for c in cells) + r"\s+│"


def test_ls_lists_every_shipped_model_recipe_op_and_module(run_cli: RunCli) -> None:
    done = run_cli(["ls"])
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for path in sorted((configs_dir() / "model").glob("*.yaml")):
        description = yaml.safe_load(path.read_text()).get("description", "")
        assert re.search(_row(path.stem, "shipped") + r" " + re.escape(description[:30]), out), path.stem
    for path in sorted(recipes_dir().glob("*.yaml")):
        assert re.search(_row(path.stem, "shipped"), out), path.stem
    for name in OPS:
        assert re.search(_row(name, "op"), out), name
    for name in MODULE_ALLOWLIST:
        assert re.search(_row(name, "module"), out), name


@pytest.mark.parametrize("op", ["GroupedLinear", "TopKRouter", "Dispatch", "ScaledSwiGLU", "Linear"])
def test_ls_op_shows_arguments_slots_in_te_order_and_the_width_rule(run_cli: RunCli, op: str) -> None:
    done = run_cli(["ls", "op", op])
    assert done.returncode == 0, done.stderr
    out = done.stdout
    spec = OPS[op]
    for param in spec.params:
        assert re.search(_row(param.name, param.type_name, _default(param.default)), out), param.name
    for slots in (spec.inputs, spec.outputs):
        positions = []
        for index, slot in enumerate(slots):
            match = re.search(_row(str(index), slot.name), out)
            assert match, slot.name
            positions.append(match.start())
        assert positions == sorted(positions)  # listed in TE's slot order
    assert f"width: {spec.width.describe()}" in out
    if spec.te_class is None:  # our own op: no TE kernel to run anywhere, so no claim about one on CPU
        assert "TE's own kernel: none" in out and "TE's own kernel runs on CPU" not in out
    else:
        assert ("TE's own kernel runs on CPU: yes" in out) is spec.te_runs_on_cpu


def test_ls_op_groupedlinear_in_words() -> None:
    """The catalog's rule for GroupedLinear, written out independently of the code that prints it."""
    spec = OPS["GroupedLinear"]
    assert [s.name for s in spec.inputs] == ["split_sizes", "scales"]
    assert (
        spec.width.describe()
        == "the width arriving must equal in_features; the width leaving is out_features"
    )


def test_ls_module_and_unknown_names(run_cli: RunCli) -> None:
    done = run_cli(["ls", "module", "LayerNorm"])
    assert done.returncode == 0, done.stderr
    assert "torch class: torch.nn.LayerNorm" in done.stdout
    bad = run_cli(["ls", "op", "GroupLinear"])
    assert bad.returncode == 2
    assert "GroupedLinear" in bad.stderr  # did you mean
    assert "Traceback" not in bad.stderr
    worse = run_cli(["ls", "modle"])
    assert worse.returncode == 2 and "models" in worse.stderr


def test_ls_includes_a_users_folder(tmp_path: Path) -> None:
    mine = tmp_path / "mine" / "model"
    mine.mkdir(parents=True)
    text = (configs_dir() / "model" / "residual_mlp.yaml").read_text()
    text = re.sub(r"^name:.*$", "name: my_mlp", text, flags=re.M)
    text = re.sub(r"^description:.*$", "description: my very own mlp", text, flags=re.M)
    (mine / "my_mlp.yaml").write_text(text)
    done = user_cli(tmp_path, ["ls", "models", "-cd", "mine"])
    assert done.returncode == 0, done.stderr
    # The origin column names the user's folder (long paths wrap inside the cell, so by its start).
    (line,) = [ln for ln in done.stdout.splitlines() if ln.startswith("│ my_mlp ")]
    assert re.search(r"│ my_mlp\s+│ /\S+\s+│ my very own mlp", line), line
    assert re.search(_row("moe_block", "shipped"), done.stdout)
    assert "ops (op: NAME" not in done.stdout  # only the group asked for
    one = user_cli(tmp_path, ["ls", "model", "my_mlp", "-cd", "mine"])
    assert one.returncode == 0, one.stderr
    assert "my very own mlp" in one.stdout and str(mine / "my_mlp.yaml") in one.stdout
    # What ls lists is what a run can pick.
    assert user_cli(tmp_path, ["validate", "-cd", "mine", "model=my_mlp"]).returncode == 0


def test_cp_copies_a_shipped_model_to_edit_and_never_overwrites(tmp_path: Path) -> None:
    done = user_cli(tmp_path, ["cp", "residual_mlp", "work"])
    assert done.returncode == 0, done.stderr
    # In a folder the copy is found by name after the shipped configs: it gets a name of its own.
    copy = tmp_path / "work" / "model" / "my_residual_mlp.yaml"
    shipped = (configs_dir() / "model" / "residual_mlp.yaml").read_text()
    assert copy.read_text() == shipped.replace(
        "name: residual_mlp", "name: my_residual_mlp  # copied from residual_mlp", 1
    )
    assert "-cd work model=my_residual_mlp" in done.stdout
    checked = user_cli(tmp_path, ["validate", "-cd", "work", "model=my_residual_mlp"])
    assert checked.returncode == 0 and str(copy) in checked.stdout
    copy.write_text(copy.read_text() + "# my edit\n")
    edited = copy.read_text()
    again = user_cli(tmp_path, ["cp", "residual_mlp", "work"])
    assert again.returncode == 1
    assert "already exists" in again.stderr and "Traceback" not in again.stderr
    assert copy.read_text() == edited
    # A file name of its own: the copy's name: follows it, and it validates under that name.
    renamed = tmp_path / "work" / "model" / "my_moe.yaml"
    done = user_cli(tmp_path, ["cp", "model/moe_block", str(renamed)])
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(renamed.read_text())["name"] == "my_moe"
    checked = user_cli(tmp_path, ["validate", "-cd", "work", "model=my_moe"])
    assert checked.returncode == 0 and "my_moe" in checked.stdout


def test_cp_a_recipe_and_unknown_sources(tmp_path: Path) -> None:
    done = user_cli(tmp_path, ["cp", "mxfp8", "work"])
    assert done.returncode == 0, done.stderr
    copied = (tmp_path / "work" / "recipe" / "my_mxfp8.yaml").read_text()
    assert (
        copied.replace("my_mxfp8  # copied from mxfp8", "mxfp8") == (recipes_dir() / "mxfp8.yaml").read_text()
    )
    bad = user_cli(tmp_path, ["cp", "moe_blok", "work"])
    assert bad.returncode == 2 and "moe_block" in bad.stderr
    assert not (tmp_path / "work" / "model").exists()
    missing = user_cli(tmp_path, ["cp", "moe_block"])
    assert missing.returncode == 2 and "DEST" in missing.stderr


def test_cp_of_a_block_says_how_a_model_uses_it_and_that_works(tmp_path: Path) -> None:
    import os
    import sys

    env = {**os.environ, "COLUMNS": "400", "NO_COLOR": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "te_assembly", "cp", "dense_layer", str(tmp_path / "mine")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "validate block=" not in done.stdout  # a block is no choice one can validate on its own
    path = re.search(r"block: (\S+), then validate that model", done.stdout)
    assert path, done.stdout
    model = tmp_path / "uses.yaml"
    model.write_text(
        "name: uses\nin_features: 64\ninput_layout: sequence\nops:\n"
        f"  - name: layers\n    block: {path.group(1)}\n"
    )
    check = subprocess.run(
        [sys.executable, "-m", "te_assembly", "validate", f"model={model}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 0, check.stdout + check.stderr
