"""The invalid corpus (``test_invalid_corpus.CASES``) as a folder of YAML files with ``.expect.yaml``
sidecars: ``tests/configs/corpus/model/``, checked by te_assembly's own pytest plugin (``te_configs`` in
``pyproject.toml``).

Each case's file is the corpus's base model with the case's edit; its sidecar lists every diagnostic
validating the file reports: the case's own (code and key path, as ``CASES`` declares it) and those the
edit legitimately causes besides (the case's ``also`` codes). ``test_corpus_folder_matches_the_cases``
keeps the folder in step with ``CASES``; after changing a case, rewrite the folder with

    python -m tests.validation.corpus_files
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from te_assembly.analysis.pipeline import load
from tests.validation.test_invalid_corpus import BASE, CASES, Case, _apply

FOLDER = Path(__file__).resolve().parents[1] / "configs" / "corpus"


def model_text(case: Case) -> str:
    model = _apply(BASE, case.patch)
    head = f"# te_assembly's invalid corpus, case {case.id}: {case.code} at {case.path}\n"
    return head + yaml.safe_dump(model, sort_keys=False)


def expect_text(case: Case, path: Path) -> str:
    """The sidecar: what validating ``path`` reports, once it is checked to hold the case's own
    diagnostic and nothing outside the case's codes."""
    found = load(path).diagnostics
    own = [d for d in found if (d.code, d.path) == (case.code, case.path)]
    if not own:
        raise AssertionError(f"{case.id}: {path} does not report {case.code} at {case.path}")
    allowed = {case.code, *case.also}
    stray = [d for d in found if d.is_error and d.code not in allowed]
    if stray:
        raise AssertionError(f"{case.id}: unexpected {[d.format() for d in stray]}")
    lines = [
        f"# Validating {case.id}.yaml reports exactly these (te_assembly's invalid corpus)",
        "diagnostics:",
    ]
    for d in found:
        lines.append(f"  - {{code: {d.code}, path: {json.dumps(d.path)}, severity: {d.severity.value}}}")
    return "\n".join(lines) + "\n"


def write(folder: Path = FOLDER) -> list[Path]:
    target = folder / "model"
    target.mkdir(parents=True, exist_ok=True)
    for old in target.glob("*.yaml"):
        old.unlink()
    written = []
    for case in CASES:
        path = target / f"{case.id}.yaml"
        path.write_text(model_text(case))
        sidecar = target / f"{case.id}.expect.yaml"
        sidecar.write_text(expect_text(case, path))
        written += [path, sidecar]
    return written


if __name__ == "__main__":
    print(f"wrote {len(write())} files into {FOLDER}")
