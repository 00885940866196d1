"""te_assembly's import of each family equals ``transformers``' own model of the same checkpoint: logits,
the next-token cross-entropy loss and the gradient of every parameter (mapped through the public
name table), on the same token ids; float64 to 1e-10, float32 to float32 rounding."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from te_assembly.engines.target import Target
from te_assembly.formats.hf.convert import from_hf
from te_assembly.jobs.verify_hf import compare, float64_islands_removed, load_transformers
from tests.hf.tiny import VARIANTS, token_ids

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_float64_logits_loss_and_every_gradient(variant: str, hf_dir: Callable[[str], Path]) -> None:
    folder = hf_dir(variant)
    mine = from_hf(folder, Target.of("reference", dtype=torch.float64)).train()
    theirs = load_transformers(folder, torch.float64).train()
    result = compare(mine, theirs, token_ids())
    grads = [k for k in result.differences if k.startswith("grad ")]
    assert len(grads) == len(list(mine.parameters()))  # every parameter compared
    for name, diff in result.differences.items():
        assert diff <= 1e-10, (variant, name, diff)
    assert result.scales["logits"] > 0.1  # not a comparison of two zeros


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_float32_against_unmodified_transformers(variant: str, hf_dir: Callable[[str], Path]) -> None:
    """transformers runs exactly as shipped (its float32 islands, its own loss)."""
    folder = hf_dir(variant)
    mine = from_hf(folder, Target.of("reference", dtype=torch.float32)).train()
    theirs = load_transformers(folder, torch.float32).train()
    result = compare(mine, theirs, token_ids(seed=1))
    assert result.dtype == "float32"
    for name in result.differences:
        assert result.relative(name) <= 2e-5, (variant, name, result.differences[name], result.scales[name])


def test_the_comparison_has_power(hf_dir: Callable[[str], Path]) -> None:
    """One expert's weight nudged by 1e-6 in te_assembly's copy: the float64 comparison sees it."""
    folder = hf_dir("mixtral")
    mine = from_hf(folder, Target.of("reference", dtype=torch.float64)).train()
    with torch.no_grad():
        mine.state_dict()["steps.layers.1.fc2.weight3"][0, 0] += 1e-6
    result = compare(mine, load_transformers(folder, torch.float64).train(), token_ids())
    assert not result.within(1e-10)


def test_float64_islands_removed_restores_the_modules(hf_dir: Callable[[str], Path]) -> None:
    model = load_transformers(hf_dir("qwen2_moe"), torch.float64)
    before = {id(m): m.forward for m in model.modules()}
    with float64_islands_removed(model) as patched:
        assert {"Qwen2MoeRMSNorm", "Qwen2MoeTopKRouter"} <= set(patched)
    assert {id(m): m.forward for m in model.modules()} == before


def test_rotary_tables_equal_transformers_bit_for_bit(hf_dir: Callable[[str], Path]) -> None:
    """llama3 scaling: the float32 frequencies te_assembly computes are transformers' exactly."""
    from te_assembly.engines.reference.attention import Rope

    model = load_transformers(hf_dir("llama-rope-llama3"), torch.float32)
    rope = Rope(500000.0, "llama3", 8.0, 1.0, 4.0, 16)
    theirs = model.model.rotary_emb.inv_freq
    assert torch.equal(rope.inv_freq(8), theirs.float())
    assert not torch.equal(Rope(500000.0).inv_freq(8), theirs.float())  # the scaling changed something


@pytest.mark.parametrize("variant", ["llama-tied-mqa", "qwen3", "qwen2-tied"])
def test_gradients_mapped_to_hugging_face_names(variant: str, hf_dir: Callable[[str], Path]) -> None:
    """Anyone can check it themselves: te_assembly's gradients through te_assembly.hf.to_hf_state_dict
    (keyed by named_parameters) equal transformers' own, parameter by parameter, by transformers' names."""
    from te_assembly.hf import to_hf_state_dict
    from te_assembly.jobs.verify_hf import next_token_loss

    folder = hf_dir(variant)
    mine = from_hf(folder, Target.of("reference", dtype=torch.float64)).train()
    theirs = load_transformers(folder, torch.float64).train()
    ids = token_ids()
    next_token_loss(mine(ids).y, ids).backward()
    with float64_islands_removed(theirs):
        next_token_loss(theirs(input_ids=ids).logits, ids).backward()
    mapped = to_hf_state_dict(mine, {n: p.grad for n, p in mine.named_parameters()})
    hf_grads = {n: p.grad for n, p in theirs.named_parameters()}
    assert set(mapped) == set(hf_grads)
    for name, grad in hf_grads.items():
        torch.testing.assert_close(mapped[name], grad, rtol=0, atol=1e-10, msg=name)


@pytest.mark.parametrize("factor", [0.5, 0.25])
def test_partial_rotary_read_inside_rope_parameters(
    factor: float, hf_dir: Callable[[str], Path], tmp_path: Path
) -> None:
    """GLM-4.5's ``partial_rotary_factor`` where transformers 5 writes it (inside ``rope_parameters``,
    none at the top level) sets how many features rotate, and the import equals transformers on it."""
    import json
    import shutil

    folder = tmp_path / "glm"
    shutil.copytree(hf_dir("glm4_moe"), folder)
    config = json.loads((folder / "config.json").read_text())
    config.pop("partial_rotary_factor", None)
    config["rope_parameters"] = {**config["rope_parameters"], "partial_rotary_factor": factor}
    (folder / "config.json").write_text(json.dumps(config))
    mine = from_hf(folder, Target.of("reference", dtype=torch.float64)).train()
    head_dim = config["head_dim"]
    rotary = {s.args.get("rotary_dim") for s in mine.plan.steps if s.type == "Attention"}
    assert rotary == {int(head_dim * factor)}
    result = compare(mine, load_transformers(folder, torch.float64).train(), token_ids())
    for name, diff in result.differences.items():
        assert diff <= 1e-10, (factor, name, diff)


def test_gpt_oss_without_layer_types_slides_where_transformers_does(tmp_path: Path) -> None:
    """A GPT-OSS config.json with no ``layer_types`` (three layers, so the pattern shows): each layer's
    window is the one transformers derives, and the import equals transformers with the window (5)
    shorter than the sequence."""
    import json

    import transformers

    from tests.hf.tiny import make

    folder = make("gpt_oss", tmp_path / "gpt_oss", changes={"num_hidden_layers": 3})
    config = json.loads((folder / "config.json").read_text())
    del config["layer_types"]
    (folder / "config.json").write_text(json.dumps(config))
    derived = transformers.AutoConfig.from_pretrained(folder).layer_types
    assert "sliding_attention" in derived and "full_attention" in derived
    expected = [config["sliding_window"] if t == "sliding_attention" else None for t in derived]
    mine = from_hf(folder, Target.of("reference", dtype=torch.float64)).train()
    windows = [s.args.get("sliding_window") for s in mine.plan.steps if s.type == "Attention"]
    assert windows == expected
    result = compare(mine, load_transformers(folder, torch.float64).train(), token_ids())
    for name, diff in result.differences.items():
        assert diff <= 1e-10, (name, diff)
