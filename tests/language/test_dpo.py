"""Preference tuning (``train.objective=dpo`` on ``data.format=preference``): the losses are TRL's
formulas on the same log-probabilities (written out here from TRL's ``DPOTrainer`` and ``CPOTrainer``),
the answers' log-probabilities are the answer tokens' alone, step 1's DPO loss is ln 2 (the policy is
its reference), LoRA's reference is the base with the adapters off (no copy), a resumed run keeps the
starting weights as its reference and ends on the uninterrupted run's losses, and bad pairs are named."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.nn import functional

from te_assembly import load
from te_assembly.data.chat import load_chat_template
from te_assembly.data.preference import PreferenceCorpus
from te_assembly.data.settings import DataSettings, TokenizerSettings
from te_assembly.engines.target import Target
from te_assembly.errors import ConfigError, DataError
from te_assembly.formats.pretrained import save_pretrained
from te_assembly.jobs.train import dpo as dpo_module
from te_assembly.jobs.train.dpo import PairLogps, dpo_loss, pair_logps
from te_assembly.jobs.train.job import train
from te_assembly.jobs.train.metrics import read_records
from te_assembly.jobs.train.settings import DPOSettings, TrainSettings

F64 = torch.float64


def _random_logps(seed: int, pairs: int = 6) -> PairLogps:
    g = torch.Generator().manual_seed(seed)
    sums = -torch.rand(4, pairs, generator=g, dtype=F64) * 20
    counts = torch.randint(1, 9, (2, pairs), generator=g).to(F64)
    return PairLogps(sums[0], sums[1], counts[0], counts[1])


def _trl(policy: PairLogps, reference: PairLogps, loss: str, beta: float, gamma: float) -> torch.Tensor:
    """TRL's formulas: DPOTrainer.dpo_loss (loss_type sigmoid, label_smoothing 0; ipo on log-probabilities
    TRL averages over the completion first) and CPOTrainer.cpo_loss (loss_type simpo)."""
    if loss == "simpo":
        pi_logratios = policy.chosen / policy.chosen_tokens - policy.rejected / policy.rejected_tokens
        logits = pi_logratios - gamma / beta
        return (-functional.logsigmoid(beta * logits)).mean()
    if loss == "ipo":
        pc, pr = policy.chosen / policy.chosen_tokens, policy.rejected / policy.rejected_tokens
        rc, rr = reference.chosen / reference.chosen_tokens, reference.rejected / reference.rejected_tokens
    else:
        pc, pr, rc, rr = policy.chosen, policy.rejected, reference.chosen, reference.rejected
    logits = (pc - pr) - (rc - rr)
    if loss == "ipo":
        return ((logits - 1 / (2 * beta)) ** 2).mean()
    return (-functional.logsigmoid(beta * logits)).mean()


@pytest.mark.parametrize("loss", ["sigmoid", "ipo", "simpo"])
@pytest.mark.parametrize("beta", [0.1, 0.5])
def test_the_loss_is_trls_formula_on_the_same_log_probabilities(loss: str, beta: float) -> None:
    policy, reference = _random_logps(1), _random_logps(2)
    settings = DPOSettings(beta=beta, loss=loss, simpo_gamma=0.7)
    mine, measures = dpo_loss(policy, reference, settings)
    assert mine.item() == pytest.approx(_trl(policy, reference, loss, beta, 0.7).item(), rel=1e-14, abs=0)
    chosen, rejected = measures["rewards/chosen"], measures["rewards/rejected"]
    assert measures["rewards/margin"].item() == pytest.approx((chosen - rejected).item(), rel=1e-12)
    assert 0 <= measures["rewards/accuracy"].item() <= 1
    if loss == "sigmoid":  # TRL's chosen_rewards = beta * (policy - reference)
        expected = (beta * (policy.chosen - reference.chosen)).mean().item()
        assert chosen.item() == pytest.approx(expected, rel=1e-12)


def test_an_answers_log_probability_is_its_tokens_alone() -> None:
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 7, 11, generator=g, dtype=F64)
    labels = torch.randint(0, 11, (4, 7), generator=g)
    labels[:, :3] = -100  # the prompt
    labels[1, 5:] = -100  # padding
    found = pair_logps(logits, labels)
    log_probs = logits.log_softmax(-1)
    expected = [
        sum(log_probs[r, t, labels[r, t]].item() for t in range(7) if labels[r, t] >= 0) for r in range(4)
    ]
    assert [found.chosen[0].item(), found.chosen[1].item()] == pytest.approx(expected[:2], rel=1e-14)
    assert [found.rejected[0].item(), found.rejected[1].item()] == pytest.approx(expected[2:], rel=1e-14)
    assert found.chosen_tokens.tolist() == [4.0, 2.0]


def _pairs(folder: Path, count: int = 10) -> Path:
    lines = [{"prompt": f"def f{n}(", "chosen": "x): return x", "rejected": "y): pass"} for n in range(count)]
    (folder / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in lines))
    return folder / "pairs.jsonl"


def _dpo(tmp: Path, out: str, **more: object) -> TrainSettings:
    base = {
        "steps": 4,
        "seq_len": 24,
        "batch_tokens": 24 * 8,
        "out_dir": str(tmp / out),
        "plot": False,
        "loggers": [],
        "objective": "dpo",
        "lr": 1e-3,
        "checkpoint_every": 2,
    }
    return TrainSettings(**{**base, **more})  # type: ignore[arg-type]


@pytest.mark.parametrize("loss", ["sigmoid", "ipo"])
def test_step_one_is_the_loss_of_a_policy_equal_to_its_reference(loss: str, tmp_path: Path) -> None:
    data = DataSettings(path=str(_pairs(tmp_path)), format="preference", val_fraction=0.0)
    settings = _dpo(tmp_path, "run", dpo=DPOSettings(beta=0.25, loss=loss))
    done = train(load("dense_lm").checked_plan(), Target.of("reference", dtype=F64), settings, data=data)
    first = read_records(tmp_path / "run" / "metrics.jsonl")[0]
    expected = math.log(2) if loss == "sigmoid" else (1 / (2 * 0.25)) ** 2
    assert first["loss"] == pytest.approx(expected, rel=1e-12)
    assert first["measures"]["rewards/margin"] == 0.0
    later = read_records(tmp_path / "run" / "metrics.jsonl")[-1]["measures"]
    assert later["rewards/margin"] > 0 and later["rewards/accuracy"] == 1.0  # it learns the preference
    assert done.last_step == 4


@pytest.mark.parametrize("lora", [False, True])
def test_in_chunks_every_step_is_the_step_with_the_logits_whole(lora: bool, tmp_path: Path) -> None:
    """``train.loss_chunk_tokens``: the policy's and the reference's log-probabilities 16 tokens at a
    time (each chunk recomputed in backward: DPO weighs each row), four steps of the same numbers."""
    plan = load("dense_lm", overrides=["lora.rank=4"] if lora else []).checked_plan()
    data = DataSettings(path=str(_pairs(tmp_path)), format="preference", val_fraction=0.0)
    for name, chunk in (("whole", None), ("chunks", 16)):
        train(
            plan, Target.of("reference", dtype=F64), _dpo(tmp_path, name, loss_chunk_tokens=chunk), data=data
        )
    whole, chunks = (read_records(tmp_path / n / "metrics.jsonl") for n in ("whole", "chunks"))
    assert len(whole) == len(chunks) == 4
    for a, b in zip(whole, chunks, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-10)
        assert b["measures"] == pytest.approx(a["measures"], rel=1e-9, abs=1e-12)
    assert whole[-1]["loss"] != whole[0]["loss"]  # the steps moved the policy


def test_lora_reference_is_the_base_with_adapters_off_and_no_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_copy(*args: object, **kwargs: object) -> object:
        raise AssertionError("the LoRA reference copied the model")

    plan = load("dense_lm", overrides=["lora.rank=4"]).checked_plan()
    monkeypatch.setattr(dpo_module, "copy", SimpleNamespace(deepcopy=no_copy))
    data = DataSettings(path=str(_pairs(tmp_path)), format="preference", val_fraction=0.0)
    train(plan, Target.of("reference", dtype=F64), _dpo(tmp_path, "lora"), data=data)
    records = read_records(tmp_path / "lora" / "metrics.jsonl")
    assert records[0]["loss"] == pytest.approx(math.log(2), rel=1e-12)  # B starts at zero: policy = base
    assert records[-1]["measures"]["rewards/margin"] > 0


def test_a_resumed_run_keeps_the_starting_weights_as_its_reference(tmp_path: Path) -> None:
    plan = load("dense_lm").checked_plan()
    target = Target.of("reference", dtype=F64, seed=4)
    start = target.build(plan, seed=11)
    save_pretrained(start, tmp_path / "start")
    data = DataSettings(path=str(_pairs(tmp_path)), format="preference", val_fraction=0.0)
    whole = train(plan, target, _dpo(tmp_path, "whole", init_from=str(tmp_path / "start")), data=data)
    stopped = _dpo(tmp_path, "part", init_from=str(tmp_path / "start"), stop_after=2)
    train(plan, target, stopped, data=data)
    resumed = dataclasses.replace(stopped, stop_after=None, resume=True)
    train(plan, target, resumed, data=data)
    records = read_records(tmp_path / "part" / "metrics.jsonl")
    assert [r["loss"] for r in records] == pytest.approx(whole.losses, rel=1e-12)
    assert records[2]["measures"] == pytest.approx(
        read_records(tmp_path / "whole" / "metrics.jsonl")[2]["measures"]
    )


@pytest.mark.parametrize(
    ("record", "words"),
    [
        ({"prompt": "a", "chosen": "b"}, "prompt, chosen and rejected"),
        ({"prompt": "a", "chosen": "b", "rejected": [{"role": "assistant", "content": "c"}]}, "all strings"),
        ({"prompt": [{"role": "user", "content": "a"}], "chosen": [], "rejected": []}, "chat template"),
    ],
)
def test_a_bad_pair_is_named_at_its_line(record: dict[str, object], words: str, tmp_path: Path) -> None:
    good = {"prompt": "a", "chosen": "b", "rejected": "c"}
    (tmp_path / "pairs.jsonl").write_text(json.dumps(good) + "\n" + json.dumps(record) + "\n")
    with pytest.raises(DataError, match=r"pairs\.jsonl:2") as caught:
        PreferenceCorpus.prepare(DataSettings(path=str(tmp_path / "pairs.jsonl"), format="preference"), 16)
    assert words in str(caught.value)


def test_conversations_take_the_chat_template_and_only_the_answer_is_labelled(tmp_path: Path) -> None:
    from tests.language.test_chat import _imported_instruct

    model = _imported_instruct(tmp_path)
    pair = {
        "prompt": [{"role": "user", "content": "what is it"}],
        "chosen": [{"role": "assistant", "content": "hello there"}],
        "rejected": [{"role": "assistant", "content": "it is"}],
    }
    (tmp_path / "pairs.jsonl").write_text(json.dumps(pair) + "\n")
    tokenizer = TokenizerSettings(path=str(model / "tokenizer.json"), eot="<|im_end|>")
    data = DataSettings(
        path=str(tmp_path / "pairs.jsonl"), format="preference", tokenizer=tokenizer, val_fraction=0.0
    )
    corpus = PreferenceCorpus.prepare(data, 32)
    x, labels = corpus.rows(corpus.train)
    template = load_chat_template(model)
    prompt = template.render(pair["prompt"], add_generation_prompt=True)
    for row, answer in enumerate(("chosen", "rejected")):
        whole = template.render([*pair["prompt"], *pair[answer]], add_generation_prompt=False)
        text = whole[len(prompt) :]  # the answer and the template's end of turn
        assert text == pair[answer][0]["content"] + "<|im_end|>\n"
        labelled = [int(t) for t in labels[row] if t >= 0]
        assert labelled == corpus.tokenizer.encode(text)  # its tokens, and only they
        assert x[row, : len(corpus.tokenizer.encode(prompt))].tolist() == corpus.tokenizer.encode(prompt)


def test_objective_and_data_format_go_together(tmp_path: Path) -> None:
    plan = load("dense_lm").checked_plan()
    text = DataSettings(path=str(_pairs(tmp_path)), format="jsonl", text_field="prompt")
    with pytest.raises(ConfigError, match=r"data\.format=preference"):
        train(plan, "reference", _dpo(tmp_path, "a"), data=text)
    pairs = DataSettings(path=str(_pairs(tmp_path)), format="preference")
    with pytest.raises(ConfigError, match=r"train\.objective=dpo"):
        train(plan, "reference", _dpo(tmp_path, "b", objective="lm"), data=pairs)
