"""DoRA (``lora.dora``, PEFT's ``use_dora``) equals PEFT in float64: a PEFT DoRA adapter (random A, B and
magnitudes) on a tiny transformers model, put on te_assembly's import, gives the same logits and the
same gradients of every A, B and magnitude; te_assembly's DoRA adapters written in PEFT's format load in
PEFT with the same logits; merging (PEFT's rescaled rows) changes nothing; a fresh DoRA adapter starts
as its base; a hand-written DoRA step without its tie is refused."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from te_assembly import load
from te_assembly.engines.target import Target
from te_assembly.errors import ConfigError
from te_assembly.formats.adapters import adapter_plan, merged_model, peft_tensors, with_adapter, write_peft
from te_assembly.formats.hf.convert import from_hf
from te_assembly.jobs.verify_hf import float64_islands_removed, load_transformers
from tests.hf.test_lora_peft import ALL, _loss
from tests.hf.tiny import token_ids

peft = pytest.importorskip("peft", reason="the PEFT comparison needs peft (the dev extras)")
pytestmark = pytest.mark.slow
F64 = torch.float64


def _their_dora(folder: Path, modules: list[str]):  # type: ignore[no-untyped-def]
    base = load_transformers(folder, F64)
    config = peft.LoraConfig(
        r=4, lora_alpha=8.0, target_modules=modules, init_lora_weights=False, use_dora=True
    )
    torch.manual_seed(7)
    model = peft.get_peft_model(base, config)
    with torch.no_grad():  # magnitudes away from the weight's norms: the rescaling matters
        for name, param in model.named_parameters():
            if "lora_magnitude_vector" in name:
                param.mul_(1 + 0.3 * torch.rand_like(param))
    return model


@pytest.mark.parametrize(
    ("variant", "modules"),
    [
        ("llama", ALL),
        ("llama", ["q_proj", "v_proj"]),  # parts of the stacked qkv
        ("gpt_oss", ["q_proj", "k_proj", "v_proj", "o_proj"]),  # biased projections
    ],
)
def test_peft_dora_adapter_equals_peft(
    variant: str, modules: list[str], hf_dir: Callable[[str], Path], tmp_path: Path
) -> None:
    folder = hf_dir(variant)
    theirs = _their_dora(folder, modules)
    theirs.save_pretrained(tmp_path / "adapter")
    base = from_hf(folder, Target.of("reference", dtype=F64))
    mine = with_adapter(base, tmp_path / "adapter")
    assert all(s.args.get("dora") for s in mine.plan.steps if s.type == "LoRA")
    ids = token_ids()
    theirs.zero_grad()
    with float64_islands_removed(theirs):
        their_logits = theirs(input_ids=ids).logits
    _loss(their_logits, ids).backward()
    their_grads = {_peft_name(k): p.grad for k, p in theirs.named_parameters() if p.requires_grad}
    mine.train().zero_grad()
    my_logits = mine(ids).y
    _loss(my_logits, ids).backward()
    assert (my_logits - their_logits.detach()).abs().max() <= 1e-10
    lora_only = with_adapter(base, _as_plain_lora(tmp_path))  # the same A and B without DoRA
    assert (lora_only(ids).y - my_logits).abs().max() > 1e-4  # the magnitudes change the model
    mapped = peft_tensors(mine.plan, {k: p.grad for k, p in mine.named_parameters() if p.requires_grad})
    assert set(mapped) == set(their_grads)  # every A, B and magnitude, and only those, trains
    for name, grad in mapped.items():
        assert (grad - their_grads[name]).abs().max() <= 1e-10, name
    assert not any("base_weight" in n for n, p in mine.named_parameters() if p.requires_grad)


def _peft_name(name: str) -> str:
    """A PEFT parameter's name as its adapter file has it (no adapter name; a magnitude without .weight)."""
    name = name.replace(".default", "")
    return name.removesuffix(".weight") if name.endswith("lora_magnitude_vector.weight") else name


def _as_plain_lora(tmp_path: Path) -> Path:
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    plain = tmp_path / "plain"
    shutil.copytree(tmp_path / "adapter", plain)
    config = json.loads((plain / "adapter_config.json").read_text())
    (plain / "adapter_config.json").write_text(json.dumps({**config, "use_dora": False}))
    tensors = {
        k: v for k, v in load_file(plain / "adapter_model.safetensors").items() if "magnitude" not in k
    }
    save_file(tensors, plain / "adapter_model.safetensors", metadata={"format": "pt"})
    return plain


def test_our_dora_adapter_loads_in_peft_and_merges(hf_dir: Callable[[str], Path], tmp_path: Path) -> None:
    folder = hf_dir("llama")
    base = from_hf(folder, Target.of("reference", dtype=F64))
    plan = adapter_plan(base.plan, {"rank": 4, "alpha": 16.0, "dora": True, "targets": ["all-linear"]})
    mine = Target.of("reference", dtype=F64).build(plan, seed=3)
    state = dict(base.state_dict())
    mine.load_state_dict(state, strict=False)
    ids = token_ids()
    with torch.no_grad():  # fresh: B zero, magnitudes the rows' norms once the base is in: the base
        assert (mine.eval()(ids).y - base(ids).y).abs().max() <= 1e-12
        for name, param in mine.named_parameters():
            if name in plan.adapter_params:
                param.add_(torch.randn_like(param) * 0.1)
    out = write_peft(plan, dict(mine.state_dict()), tmp_path / "adapter")
    theirs = peft.PeftModel.from_pretrained(load_transformers(folder, F64), out).eval()
    assert theirs.peft_config["default"].use_dora
    with float64_islands_removed(theirs):
        their_logits = theirs(input_ids=ids).logits
    my_logits = mine(ids).y
    assert (my_logits - their_logits).abs().max() <= 1e-10
    merged = merged_model(mine)
    assert not merged.plan.adapter_params
    assert (merged(ids).y - my_logits).abs().max() <= 1e-10


def test_a_dora_step_without_its_tie_is_refused() -> None:
    with pytest.raises(ConfigError, match="dora: true") as caught:
        load(
            {
                "model": {
                    "name": "hand",
                    "in_features": 8,
                    "ops": [
                        {"name": "keep", "op": "MakeExtraOutput", "extra_outputs": {"out": "x"}},
                        {"name": "proj", "op": "Linear", "args": {"in_features": 8, "out_features": 8}},
                        {
                            "name": "proj_lora",
                            "op": "LoRA",
                            "args": {"in_features": 8, "out_features": 8, "rank": 2, "dora": True},
                            "extra_inputs": {"x": "x"},
                        },
                    ],
                }
            }
        ).checked_plan()
    assert "tie_weight: proj" in str(caught.value)


def test_dora_from_the_command_line_trains_and_exports_for_peft(tmp_path: Path) -> None:
    """A user's DoRA fine-tune (the LoRA guide's commands with lora.dora=true): the magnitudes start at
    the imported weight's row norms and train; PEFT loads the export with the same logits."""
    from tests.conftest import user_cli
    from tests.hf.tiny import make

    make("llama", tmp_path / "hf", changes={"vocab_size": 272})
    (tmp_path / "text.txt").write_text("the quick brown fox jumps over the lazy dog. " * 200)
    assert user_cli(tmp_path, "import-hf", "hf", "mine").returncode == 0
    args = ["-cd", "mine", "model=mine", "train.init_from=mine", "lora.rank=8", "lora.dora=true"]
    args += [
        "data.path=text.txt",
        "train.steps=4",
        "train.seq_len=32",
        "train.batch_tokens=128",
        "train.out_dir=run",
    ]
    done = user_cli(tmp_path, "train", *args)
    assert done.returncode == 0, done.stdout + done.stderr
    done = user_cli(tmp_path, "export", "run", "adapter", "export.format=peft")
    assert done.returncode == 0, done.stderr
    from te_assembly.formats.pretrained import from_checkpoint

    ids = torch.randint(0, 272, (2, 12), generator=torch.Generator().manual_seed(0))
    mine = from_checkpoint(tmp_path / "run", "reference")
    magnitudes = {n: p for n, p in mine.named_parameters() if "lora_magnitude" in n}
    base = transformers_model(tmp_path / "hf")
    norms = {
        n: torch.linalg.norm(
            mine.state_dict()[n.replace("_lora.lora_magnitude0", ".basic_ops.0.weight")], dim=1
        )
        for n in magnitudes
        if n.endswith("fc2_lora.lora_magnitude0")
    }
    for name, norm in norms.items():  # trained from the row norms, not from ones
        assert 0 < (magnitudes[name] - norm).abs().max() < 0.05 * norm.abs().max()
    theirs = peft.PeftModel.from_pretrained(base, str(tmp_path / "adapter")).eval()
    assert (mine(ids).y - theirs(input_ids=ids).logits).abs().max() <= 1e-5


def transformers_model(folder: Path):  # type: ignore[no-untyped-def]
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
