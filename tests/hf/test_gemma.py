"""What Gemma 2 and Gemma 3 bring beyond the other families, each shown to matter: the soft-caps bend
the tiny models' logits (so the float64 equality with transformers in ``test_equal_to_transformers``
holds them to it), transformers' float32 islands of the (1 + w) norms and of the eager softmax are
restated for the comparison and put back, TE's missing soft-capping kernel is named in the fusion
table and its step runs the reference attention, and a Gemma config's unwritten
``tie_word_embeddings`` is true, as transformers reads it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from rich.console import Console

from te_assembly.analysis.fusions import FusionTarget
from te_assembly.engines.target import Target
from te_assembly.engines.te.bindings import gpu_only_steps
from te_assembly.formats.hf.convert import analysis_of, from_hf, read_spec
from te_assembly.jobs.verify_hf import compare, float64_islands_removed, load_transformers
from te_assembly.views.fusions import fusion_table
from tests.hf.tiny import make, token_ids

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("cap", ["attn_logit_softcapping", "final_logit_softcapping"])
def test_each_soft_cap_changes_the_tiny_model(
    cap: str, hf_dir: Callable[[str], Path], tmp_path: Path
) -> None:
    """transformers' model of the same weights without one of the caps is far from te_assembly's import
    with it: the caps bite at the test's sizes, so the equality tests would see one dropped."""
    mine = from_hf(hf_dir("gemma2"), Target.of("reference", dtype=torch.float64)).train()
    uncapped = make("gemma2", tmp_path / "uncapped", changes={cap: None})
    result = compare(mine, load_transformers(uncapped, torch.float64).train(), token_ids())
    assert result.relative("logits") > 1e-4


@pytest.mark.parametrize(("variant", "norm"), [("gemma2", "Gemma2RMSNorm"), ("gemma3", "Gemma3RMSNorm")])
def test_float64_islands_are_restated_and_put_back(
    variant: str, norm: str, hf_dir: Callable[[str], Path]
) -> None:
    model = load_transformers(hf_dir(variant), torch.float64)
    before = {id(m): m.forward for m in model.modules()}
    softmax = torch.nn.functional.softmax
    with float64_islands_removed(model) as patched:
        assert norm in patched
        # Gemma 2's soft-capping runs transformers' eager attention; Gemma 3's SDPA has no island
        assert ("eager softmax" in patched) == (variant == "gemma2")
        x = torch.randn(3, 5, dtype=torch.float64)
        assert torch.nn.functional.softmax(x, dim=-1, dtype=torch.float32).dtype == (
            torch.float64 if variant == "gemma2" else torch.float32
        )
    assert torch.nn.functional.softmax is softmax
    assert {id(m): m.forward for m in model.modules()} == before


def test_soft_capped_attention_runs_the_reference_module_in_the_te_engine(
    hf_dir: Callable[[str], Path],
) -> None:
    """TE's DotProductAttention has no soft-capping: Gemma 2's attention steps are not among the steps
    that need TE's GPU kernels, the fusion table says why, and Gemma 3's (no cap) still are."""
    capped = analysis_of(read_spec(hf_dir("gemma2")), "g2")[0].checked_plan()
    plain = analysis_of(read_spec(hf_dir("gemma3")), "g3")[0].checked_plan()
    assert not [s for s in gpu_only_steps(capped, "te") if s.endswith("(Attention)")]
    assert len([s for s in gpu_only_steps(plain, "te") if s.endswith("(Attention)")]) == 3
    console = Console(width=300, record=True)
    console.print(fusion_table(capped, FusionTarget(kernels="te")))
    text = console.export_text()
    assert "TE has no kernel for soft-capping of the attention logits" in text
    console = Console(width=300, record=True)
    console.print(fusion_table(plain, FusionTarget(kernels="te")))
    assert "no kernel for soft-capping" not in console.export_text()


@pytest.mark.parametrize("variant", ["gemma2", "gemma3"])
def test_unwritten_tie_word_embeddings_is_true_for_gemma(
    variant: str, hf_dir: Callable[[str], Path], tmp_path: Path
) -> None:
    """A Gemma config.json without ``tie_word_embeddings`` (the Hub's Gemma 2 files) is tied, as
    transformers' Gemma configs default to; te_assembly's model then has no separate head weight."""
    folder = tmp_path / variant
    folder.mkdir()
    for path in hf_dir(variant).iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    config = json.loads((folder / "config.json").read_text())
    del config["tie_word_embeddings"]
    (folder / "config.json").write_text(json.dumps(config))
    assert read_spec(folder).tied
    mine = from_hf(folder, Target.of("reference", dtype=torch.float64))
    assert not any(name.startswith("steps.head.") for name in mine.state_dict())
    assert compare(mine.train(), load_transformers(folder, torch.float64).train(), token_ids()).within(1e-10)
