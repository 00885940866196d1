"""Imported Hugging Face families through TE's fusers (``kernels=reference`` on CPU): Gemma's
zero-centred norms, embedding scale and soft-caps (an op of ours inside TE's fuser) and OLMo 2's
post-norms equal transformers' model in float64, as the reference engine does."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from te_assembly.engines.target import Target
from te_assembly.formats.hf.convert import from_hf
from te_assembly.jobs.verify_hf import compare, load_transformers
from tests.hf.tiny import make, token_ids

pytestmark = pytest.mark.te


@pytest.mark.parametrize("variant", ["gemma2", "gemma3", "olmo2"])
def test_te_engine_equals_transformers_in_float64(variant: str, tmp_path: Path) -> None:
    folder = make(variant, tmp_path / variant)
    mine = from_hf(folder, Target.of("te", kernels="reference", dtype=torch.float64)).train()
    result = compare(mine, load_transformers(folder, torch.float64).train(), token_ids())
    assert len([k for k in result.differences if k.startswith("grad ")]) == len(list(mine.parameters()))
    assert result.within(1e-10), result.worst()
