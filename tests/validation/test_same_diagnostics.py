"""One config, one list of diagnostics: ``validate``, ``graph`` and ``build()`` report exactly the same
findings (computed once, in the analysis), in the same order, with the same file:line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import te_assembly
from te_assembly.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[2]

BROKEN = """\
name: broken
in_features: 8
descripton: a typo                 # unknown key, with a suggestion
ops:
  - name: tap
    op: MakeExtraOutput
    extra_outputs: {out: {channel: res, public: false}}
  - name: unused
    op: MakeExtraOutput
    extra_outputs: {out: {channel: spare, public: false}}   # a warning
  - name: bias
    op: Bias
    args: {size: 9}                # width mismatch
  - name: add
    op: AddExtraInput
    extra_inputs: {addend: ress}   # dangling, did you mean 'res'?
"""

_FINDING = re.compile(r"^\S+:\d+: (?:error|warning): .*$", re.M)


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "400", "NO_COLOR": "1", "TERM": "dumb", "PYTHONPATH": str(REPO_ROOT)}
    command = [sys.executable, "-m", "te_assembly", *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_validate_graph_and_build_report_the_same_diagnostics(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(BROKEN)
    with pytest.raises(ConfigError) as caught:
        te_assembly.build(path, "reference")
    from_build = [d.format() for d in caught.value.diagnostics]
    from_load = [d.format() for d in te_assembly.load(path).diagnostics]
    validate = _cli(tmp_path, "validate", f"model={path}")
    graph = _cli(tmp_path, "graph", f"model={path}", f"graph.out_dir={tmp_path / 'g'}")
    assert validate.returncode == graph.returncode == 2
    assert _FINDING.findall(validate.stderr) == _FINDING.findall(graph.stderr) == from_build == from_load
    codes = [d.code for d in caught.value.diagnostics]
    assert codes == ["unknown-key", "unused-hidden-output", "width-mismatch", "dangling-input"]
    assert caught.value.diagnostics[1].path == "model.ops[1].extra_outputs.out.channel"  # not res: misspelt
    assert all(d.file == str(path) for d in caught.value.diagnostics)
