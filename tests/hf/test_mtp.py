"""Multi-token prediction modules (DeepSeek-V3's, GLM-4.5's) as the published checkpoints hold them:
imported, computed as an independent model built from transformers' own classes computes them (float64:
the module's logits, the DeepSeek-V3 MTP loss and every gradient), trained with ``train.mtp_weight``,
exported back under their names, and left out of what transformers is compared with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import te_assembly
from te_assembly.engines.base import ahead_outputs
from te_assembly.engines.target import Target
from te_assembly.errors import CheckpointError
from te_assembly.formats.hf.convert import export_hf, from_hf, from_hf_state_dict, read_spec
from te_assembly.jobs import objective
from te_assembly.jobs.verify import state_dict_parameters
from te_assembly.jobs.verify_hf import float64_islands_removed, load_transformers
from tests.hf.tiny import make, token_ids

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.slow

MODULE_OWN = ("enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight")
SHARED = ("embed_tokens.weight", "shared_head.head.weight")


def _published(variant: str, folder: Path, seed: int = 1, vocab: int = 96) -> Path:
    """A tiny ``variant`` checkpoint declaring one MTP layer and holding its tensors as DeepSeek-V3's and
    GLM-4.5's published files do: ``model.layers.{L}`` with enorm, hnorm, eh_proj, a decoder layer (a
    MoE one: the last layer's, perturbed), shared_head.norm, and copies of the model's embedding and
    head."""
    make(variant, folder, changes={"num_nextn_predict_layers": 1, "vocab_size": vocab})
    config = json.loads((folder / "config.json").read_text())
    layers, hidden = config["num_hidden_layers"], config["hidden_size"]
    tensors = load_file(str(folder / "model.safetensors"))
    generator = torch.Generator().manual_seed(seed)
    mtp = f"model.layers.{layers}."
    for name, value in list(tensors.items()):
        if name.startswith(f"model.layers.{layers - 1}."):
            noise = torch.randn(value.shape, generator=generator) * 0.05
            tensors[mtp + name.removeprefix(f"model.layers.{layers - 1}.")] = value + noise.to(value.dtype)
    for name in ("enorm.weight", "hnorm.weight", "shared_head.norm.weight"):
        tensors[mtp + name] = 1 + 0.2 * torch.randn(hidden, generator=generator)
    tensors[mtp + "eh_proj.weight"] = torch.randn(hidden, 2 * hidden, generator=generator) * 0.1
    tensors[mtp + "embed_tokens.weight"] = tensors["model.embed_tokens.weight"].clone()
    tensors[mtp + "shared_head.head.weight"] = tensors["lm_head.weight"].clone()
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


class Reference(torch.nn.Module):
    """DeepSeek-V3's MTP module around transformers' model (its README's and vLLM's formulation, built
    here from transformers' own classes, not te_assembly's): h = the last layer's output (before the
    final norm); x = eh_proj([enorm(embed(tokens one on)) | hnorm(h)]); the module's decoder layer and
    shared_head.norm are a one-layer transformers model of the same family run on x; its logits use
    the model's own head."""

    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.main = load_transformers(folder, torch.float64).train()
        config = json.loads((folder / "config.json").read_text())
        layers, hidden = config["num_hidden_layers"], config["hidden_size"]
        # the module's decoder layer and shared_head.norm as a one-layer checkpoint of the family, which
        # transformers loads its own way (its expert layout included)
        one = {**config, "num_hidden_layers": 1, "first_k_dense_replace": 0, "num_nextn_predict_layers": 0}
        folder_one = folder.parent / f"{folder.name}-mtp-layer"
        folder_one.mkdir()
        (folder_one / "config.json").write_text(json.dumps(one))
        tensors = load_file(str(folder / "model.safetensors"))
        mtp = f"model.layers.{layers}."
        own = {
            f"model.layers.0.{n.removeprefix(mtp)}": v
            for n, v in tensors.items()
            if n.startswith(mtp)
            and not n.removeprefix(mtp).startswith(
                ("enorm", "hnorm", "eh_proj", "shared_head", "embed_tokens")
            )
        }
        own["model.norm.weight"] = tensors[mtp + "shared_head.norm.weight"]
        own["model.embed_tokens.weight"] = tensors["model.embed_tokens.weight"]
        own["lm_head.weight"] = tensors["lm_head.weight"]
        save_file(own, str(folder_one / "model.safetensors"), metadata={"format": "pt"})
        self.layer = load_transformers(folder_one, torch.float64).model.train()
        eps = config.get("rms_norm_eps", 1e-6)
        self.enorm = _norm(tensors[mtp + "enorm.weight"], eps)
        self.hnorm = _norm(tensors[mtp + "hnorm.weight"], eps)
        self.eh_proj = torch.nn.Linear(2 * hidden, hidden, bias=False, dtype=torch.float64)
        with torch.no_grad():
            self.eh_proj.weight.copy_(tensors[mtp + "eh_proj.weight"])

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        kept: list[torch.Tensor] = []
        hook = self.main.model.layers[-1].register_forward_hook(
            lambda module, args, out: kept.append(out[0] if isinstance(out, tuple) else out)
        )
        try:
            logits = self.main(input_ids=ids).logits
        finally:
            hook.remove()
        embeds = self.main.model.embed_tokens(ids)
        shifted = torch.cat([embeds[:, 1:], torch.zeros_like(embeds[:, :1])], dim=1)
        x = self.eh_proj(torch.cat([self.enorm(shifted), self.hnorm(kept[0])], dim=-1))
        out = self.layer(inputs_embeds=x).last_hidden_state
        return logits, out @ self.main.lm_head.weight.T


def _norm(weight: torch.Tensor, eps: float) -> torch.nn.Module:
    norm = torch.nn.RMSNorm(weight.shape[0], eps=eps, dtype=torch.float64)
    with torch.no_grad():
        norm.weight.copy_(weight)
    return norm


@pytest.mark.parametrize("variant", ["deepseek_v3", "glm4_moe"])
def test_an_imported_mtp_module_computes_deepseek_v3s_mtp_loss(variant: str, tmp_path: Path) -> None:
    """The module's logits, the loss (next-token cross-entropy + mtp_weight x the module's cross-entropy
    against the token after the next) and every gradient, the shared embedding's and head's included,
    equal the reference built from transformers' classes in float64."""
    folder = _published(variant, tmp_path / "hf")
    spec = read_spec(folder)
    assert (spec.mtp_layers, spec.mtp_modules) == (1, 1)
    mine = from_hf(folder, Target.of("reference", dtype=torch.float64)).train()
    assert ahead_outputs(mine.plan) == {"mtp1_logits": 1}
    reference = Reference(folder)
    ids = token_ids(vocab=96, seq=12)
    labels = ids.roll(-1, dims=-1)
    labels[:, -1] = objective.IGNORE_INDEX
    weight = 0.3
    y, extras = mine(ids)
    terms = objective.next_token_terms(y, labels, extras, (), ahead={"mtp1_logits": 1}, mtp_weight=weight)
    objective.total(terms).backward()
    with float64_islands_removed(reference.main), float64_islands_removed(reference.layer):
        logits, ahead = reference(ids)
    ce = torch.nn.functional.cross_entropy
    mtp = ce(ahead[:, :-2].reshape(-1, 96), ids[:, 2:].reshape(-1))
    loss = ce(logits[:, :-1].reshape(-1, 96), ids[:, 1:].reshape(-1)) + weight * mtp
    loss.backward()
    torch.testing.assert_close(extras["mtp1_logits"], ahead, rtol=0, atol=1e-10)
    torch.testing.assert_close(terms[objective.MTP], weight * mtp, rtol=0, atol=1e-12)
    torch.testing.assert_close(objective.total(terms), loss, rtol=0, atol=1e-12)
    layers = json.loads((folder / "config.json").read_text())["num_hidden_layers"]
    mtp_prefix = f"model.layers.{layers}."
    theirs = {n: p.grad for n, p in reference.main.named_parameters() if p.grad is not None}
    for n, p in reference.layer.named_parameters():
        if n.startswith("layers.0.") and p.grad is not None:
            theirs[mtp_prefix + n.removeprefix("layers.0.")] = p.grad
    theirs[mtp_prefix + "shared_head.norm.weight"] = reference.layer.norm.weight.grad
    for name, module in (
        ("enorm", reference.enorm),
        ("hnorm", reference.hnorm),
        ("eh_proj", reference.eh_proj),
    ):
        theirs[f"{mtp_prefix}{name}.weight"] = module.weight.grad
    expected = from_hf_state_dict(mine, theirs)  # transformers' names and layouts as te_assembly's
    grads = {n: p.grad for n, p in state_dict_parameters(mine).items()}
    assert set(expected) == set(grads), sorted(set(expected) ^ set(grads))
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected[name], rtol=0, atol=1e-10, msg=name)
    assert grads["steps.mtp1_proj.basic_ops.0.weight"].abs().max() > 0  # the module is trained


def _hub_tensors(folder: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(str(path)))
    return tensors


def test_the_module_round_trips_and_trains_with_mtp_weight(tmp_path: Path) -> None:
    """import-hf -> train from it with train.mtp_weight -> export: the exported checkpoint holds the
    module under its published names (embed_tokens and shared_head.head as copies of the model's),
    declares it in config.json, and transformers loads the rest equal to the trained model; the module
    moved with a weight and not at all with mtp_weight=0, and the step's mtp term is in metrics.jsonl."""
    from te_assembly.jobs.train.settings import TrainSettings

    source = _published("deepseek_v3", tmp_path / "src", vocab=272)  # the byte tokenizer's ids fit
    pretrained = te_assembly.import_hf(source, tmp_path / "imported")
    again = te_assembly.from_pretrained(pretrained, Target.of("reference", dtype=torch.float64))
    exported = te_assembly.to_hf(again, tmp_path / "round")
    assert _hub_tensors(exported).keys() == _hub_tensors(source).keys()
    assert all(torch.equal(v, _hub_tensors(source)[k]) for k, v in _hub_tensors(exported).items())
    plan = te_assembly.load("imported", config_dirs=[pretrained]).checked_plan()
    data = te_assembly.DataSettings(path=str(Path(te_assembly.__file__)))
    runs = {}
    for weight in (0.3, 0.0):
        settings = TrainSettings(
            steps=2,
            lr=1e-2,
            warmup_steps=0,
            checkpoint_every=0,
            plot=False,
            loggers=[],
            out_dir=str(tmp_path / f"run-{weight}"),
            init_from=str(pretrained),
            batch_tokens=64,
            seq_len=16,
            mtp_weight=weight,
        )
        te_assembly.train(plan, Target.of("reference", dtype=torch.float64), settings, data=data)
        runs[weight] = export_hf(tmp_path / f"run-{weight}", tmp_path / f"hf-{weight}")
    layers = json.loads((source / "config.json").read_text())["num_hidden_layers"]
    module = f"model.layers.{layers}."
    start = _hub_tensors(source)
    for weight, out in runs.items():
        assert json.loads((out / "config.json").read_text())["num_nextn_predict_layers"] == 1
        tensors = _hub_tensors(out)
        assert torch.equal(tensors[module + "embed_tokens.weight"], tensors["model.embed_tokens.weight"])
        assert torch.equal(tensors[module + "shared_head.head.weight"], tensors["lm_head.weight"])
        moved = not torch.equal(tensors[module + "eh_proj.weight"], start[module + "eh_proj.weight"])
        assert moved == (weight > 0), weight
        records = [json.loads(line) for line in (tmp_path / f"run-{weight}" / "metrics.jsonl").open()]
        steps = [r for r in records if "step" in r and "loss" in r]
        assert steps and all(("mtp" in r["terms"]) == (weight > 0) for r in steps)
    trained = te_assembly.from_checkpoint(tmp_path / "run-0.3", Target.of("reference", dtype=torch.float64))
    ids = token_ids(vocab=272)
    theirs = load_transformers(runs[0.3], torch.float64)
    with torch.no_grad(), float64_islands_removed(theirs):
        torch.testing.assert_close(theirs(input_ids=ids).logits, trained(ids).y, rtol=0, atol=1e-10)


def test_copies_that_differ_from_the_model_are_refused(tmp_path: Path) -> None:
    """te_assembly holds the module's embed_tokens and shared_head.head as the model's own tensors: a
    checkpoint whose copies differ is refused, naming both, before anything is written."""
    folder = _published("glm4_moe", tmp_path / "hf")
    tensors = load_file(str(folder / "model.safetensors"))
    layers = json.loads((folder / "config.json").read_text())["num_hidden_layers"]
    tensors[f"model.layers.{layers}.shared_head.head.weight"] += 0.01
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError) as refused:
        te_assembly.import_hf(folder, tmp_path / "out")
    assert f"model.layers.{layers}.shared_head.head.weight differs from lm_head.weight" in str(refused.value)
    assert not (tmp_path / "out").exists()


def test_verify_compares_the_rest_and_says_the_module_was_imported(tmp_path: Path) -> None:
    """verify hf= on a checkpoint with the module: transformers loads the model without it, so the
    logits, loss and every other gradient are compared and pass; the report's note says the module was
    imported (and never that the checkpoint holds none)."""
    from te_assembly.jobs.verify_hf import verify_hf

    folder = _published("deepseek_v3", tmp_path / "hf")
    report = verify_hf(folder, Target.of("reference", dtype=torch.float64))
    assert report.passed
    (note,) = report.notes
    assert note.startswith("imported the 1 multi-token prediction module(s) the checkpoint holds")
    compared = report.comparison.differences
    assert any(".layers." in name for name in compared)
    assert not any("mtp" in name for name in compared)


@pytest.mark.parametrize("engine", ["reference", pytest.param("te", marks=pytest.mark.te)])
def test_generation_with_the_module_is_the_models_own(engine: str, tmp_path: Path) -> None:
    """Generating from a model with the module (its steps run on every token, its own key/value cache
    included) gives the very logits of the model imported without it, cached and uncached; in TE's
    fusers the module's logits equal the reference engine's."""
    from te_assembly.jobs.generate.decode import decode
    from te_assembly.jobs.generate.settings import GenerateSettings

    if engine == "te":
        pytest.importorskip("transformer_engine.pytorch", reason="the TE engine needs transformer_engine")
    folder = _published("deepseek_v3", tmp_path / "hf")
    target = Target.of(engine, kernels="reference" if engine == "te" else "te", dtype=torch.float64)
    mine = from_hf(folder, target)
    without = from_hf(folder, target, ignore_fields=["num_nextn_predict_layers"])
    assert not ahead_outputs(without.plan)
    ids = token_ids(seq=9)
    with torch.no_grad():
        torch.testing.assert_close(mine(ids).y, without(ids).y, rtol=0, atol=0)
        if engine == "te":
            reference = from_hf(folder, Target.of("reference", dtype=torch.float64))
            torch.testing.assert_close(
                mine(ids).extras["mtp1_logits"], reference(ids).extras["mtp1_logits"], rtol=0, atol=1e-10
            )
    seen: dict[str, list[torch.Tensor]] = {"mtp": [], "plain": []}
    settings = GenerateSettings(temperature=0, max_new_tokens=6)
    for key, model in (("mtp", mine), ("plain", without)):

        def choose(
            logits: torch.Tensor, settings: GenerateSettings, generator: torch.Generator, key: str = key
        ) -> int:
            seen[key].append(logits.clone())
            return int(logits.argmax())

        decode(model, [ids[0].tolist()], settings, torch.Generator(), choose, frozenset())
    assert len(seen["mtp"]) == 6
    for a, b in zip(seen["mtp"], seen["plain"], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_import_and_verify_say_in_one_line_that_the_module_was_imported(tmp_path: Path) -> None:
    """From the command line, as a user runs them: import-hf and verify hf= each say once that the
    module was imported (never that the checkpoint holds none), and verify passes on the rest."""
    from tests.conftest import user_cli

    _published("deepseek_v3", tmp_path / "ds")
    line = "imported the 1 multi-token prediction module(s) the checkpoint holds (model.layers.3...)"
    imported = user_cli(tmp_path, "import-hf", "ds", "ds_te")
    verified = user_cli(tmp_path, "verify", "hf=ds", "dtype=float64")
    for done in (imported, verified):
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.count("multi-token") == 1 and line in done.stdout, done.stdout
