"""LoRA as a user runs it, from a folder outside the repository: import a transformers checkpoint,
fine-tune rank-8 adapters on text with a few settings, export the adapter for PEFT (which loads it onto
the same transformers model with the same logits), merge it (te and Hugging Face formats), and bring a
PEFT adapter in with ``import_hf.adapter``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from te_assembly.formats.pretrained import from_checkpoint, from_pretrained
from tests.conftest import user_cli
from tests.hf.tiny import make

peft = pytest.importorskip("peft", reason="the PEFT comparison needs peft (the dev extras)")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

TRAIN = ["-cd", "mine", "model=mine", "train.init_from=mine", "lora.rank=8", "data.path=text.txt"]
TRAIN += ["train.seq_len=32", "train.batch_tokens=256", "train.out_dir=run"]
"""The user's fine-tune: their import, rank-8 adapters, their text."""


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("lora-user")
    make("llama", where / "hf", changes={"vocab_size": 272})  # room for the byte-level tokenizer
    (where / "text.txt").write_text("the quick brown fox jumps over the lazy dog. " * 400)
    done = user_cli(where, "import-hf", "hf", "mine")
    assert done.returncode == 0, done.stderr
    done = user_cli(where, "train", *TRAIN, "train.steps=30", "train.plot=false")
    assert done.returncode == 0, done.stderr
    return where


def _logits_peft(where: Path, adapter: Path, ids: torch.Tensor) -> torch.Tensor:
    base = transformers.AutoModelForCausalLM.from_pretrained(where / "hf", dtype=torch.float32)
    return peft.PeftModel.from_pretrained(base, str(adapter)).eval()(input_ids=ids).logits


def test_the_run_trains_only_adapters_and_keeps_only_them(trained: Path) -> None:
    losses = [
        json.loads(line)["loss"] for line in (trained / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.1
    checkpoint = max((trained / "run").glob("ckpt-*.safetensors"))
    with safe_open(checkpoint, "pt") as f:
        model_keys = [k for k in f.keys() if k.startswith("model/")]
    assert model_keys and all(".lora_A" in k or ".lora_B" in k for k in model_keys)
    # 2 layers x (q, k, v, o, gate, up, down) x (A, B)
    assert len(model_keys) == 2 * 7 * 2


def test_peft_loads_the_exported_adapter_with_the_same_logits(trained: Path) -> None:
    done = user_cli(trained, "export", "run", "adapter", "export.format=peft")
    assert done.returncode == 0, done.stderr
    ids = torch.randint(0, 272, (2, 12), generator=torch.Generator().manual_seed(0))
    theirs = _logits_peft(trained, trained / "adapter", ids)
    mine = from_checkpoint(trained / "run", "reference")(ids).y
    base = transformers.AutoModelForCausalLM.from_pretrained(trained / "hf", dtype=torch.float32)
    assert (mine - base(input_ids=ids).logits).abs().max() > 1e-3  # the adapters changed the model
    assert (mine - theirs).abs().max() <= 1e-5


def test_merged_exports_equal_the_unmerged_model(trained: Path) -> None:
    ids = torch.randint(0, 272, (2, 12), generator=torch.Generator().manual_seed(1))
    unmerged = from_checkpoint(trained / "run", "reference")(ids).y
    assert user_cli(trained, "export", "run", "merged", "export.merge=true").returncode == 0
    merged = from_pretrained(trained / "merged", "reference")
    assert not merged.plan.adapter_params
    assert (merged(ids).y - unmerged).abs().max() <= 1e-5
    done = user_cli(trained, "export", "run", "merged_hf", "export.format=hf", "export.merge=true")
    assert done.returncode == 0, done.stderr
    hf = transformers.AutoModelForCausalLM.from_pretrained(trained / "merged_hf", dtype=torch.float32)
    assert (hf(input_ids=ids).logits - unmerged).abs().max() <= 1e-5
    refused = user_cli(trained, "export", "run", "plain_hf", "export.format=hf")
    assert refused.returncode != 0 and "export.merge=true" in refused.stderr + refused.stdout


def test_a_peft_adapter_imports_beside_its_base(trained: Path) -> None:
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    base = transformers.AutoModelForCausalLM.from_pretrained(trained / "hf", dtype=torch.float32)
    torch.manual_seed(5)
    theirs = peft.get_peft_model(base, config).eval()
    theirs.save_pretrained(trained / "their_adapter")
    done = user_cli(trained, "import-hf", "hf", "with_adapter", "import_hf.adapter=their_adapter")
    assert done.returncode == 0, done.stderr
    mine = from_pretrained(trained / "with_adapter", "reference")
    assert len(mine.plan.adapter_params) == 2 * 2 * 2  # layers x (q, v) x (A, B)
    ids = torch.randint(0, 272, (1, 10), generator=torch.Generator().manual_seed(2))
    assert (mine(ids).y - theirs(input_ids=ids).logits).abs().max() <= 1e-5


def test_a_resume_on_another_base_is_refused(trained: Path, tmp_path: Path) -> None:
    args = [*TRAIN, "train.steps=40", "train.resume=true"]
    make("llama", tmp_path / "other", seed=9, changes={"vocab_size": 272})
    assert (
        user_cli(
            trained, "import-hf", str(tmp_path / "other"), str(tmp_path / "other_te"), "import_hf.name=mine"
        ).returncode
        == 0
    )
    other = [a if a != "train.init_from=mine" else f"train.init_from={tmp_path / 'other_te'}" for a in args]
    done = user_cli(trained, "train", *other)
    assert done.returncode != 0
    assert "base.sha256" in done.stderr + done.stdout


def test_the_readme_lora_commands_on_a_checkpoint_with_its_own_tokenizer(tmp_path: Path) -> None:
    """The README's two LoRA lines as written (a few steps added), on a transformers checkpoint that
    brings its tokenizer: the fine-tune reads the text with ``train.init_from``'s tokenizer without being
    told, and the adapter exports."""
    import re
    import shlex

    from te_assembly.data.tokenizer import train_bpe
    from te_assembly.formats.tokenizer_record import recorded_tokenizer
    from tests.docs_text import block_after

    source = make("llama", tmp_path / "hf", changes={"vocab_size": 300})
    train_bpe(["the quick brown fox jumps over the lazy dog."] * 50, 300, "<|endoftext|>").save(
        source / "tokenizer.json"
    )
    assert user_cli(tmp_path, "import-hf", "hf", "my_model").returncode == 0
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("the quick brown fox jumps over the lazy dog. " * 200)
    train_line, export_line = block_after("README.md", "**LoRA**", "bash").strip().splitlines()
    train = shlex.split(train_line)[3:]  # after "python -m te_assembly"
    done = user_cli(tmp_path, *train, "train.steps=3", "train.seq_len=32", "train.batch_tokens=256")
    assert done.returncode == 0, done.stdout + done.stderr
    (run,) = (tmp_path / "outputs" / "my_model").iterdir()
    imported = recorded_tokenizer(tmp_path / "my_model")
    assert imported is not None and imported.startswith("tokenizers/")
    assert recorded_tokenizer(run) == imported
    export = shlex.split(
        re.sub(r"outputs/my_model/<date>_<time>", f"outputs/my_model/{run.name}", export_line)
    )
    done = user_cli(tmp_path, *export[3:])
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()
