"""``data.packing``: documents (text) and conversations (chat) side by side in a row compute exactly what
each computes alone: the loss of a packed batch and every gradient equal those of its documents run one
by one (float64, the reference engine and TE's fusers), positions restart at each document, no label
predicts across a document's end, the chat loss mask is kept, and an attention step that cannot keep
documents apart is refused rather than mixing them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from te_assembly import load
from te_assembly.data.settings import DataSettings
from te_assembly.engines.reference.packing import packed, positions_in_documents
from te_assembly.engines.target import Target
from te_assembly.errors import ArgumentError
from te_assembly.jobs import objective
from te_assembly.jobs.train.lm_task import LanguageTask

F64 = torch.float64
IGNORE = objective.IGNORE_INDEX


def _loss_and_grads(
    model: torch.nn.Module, rows: list[tuple[torch.Tensor, ...]]
) -> tuple[float, dict[str, torch.Tensor]]:
    """The token-weighted cross-entropy of ``rows`` (each ``(x, labels[, documents])``) and its
    gradients: the mean over every labelled token of them all."""
    model.zero_grad()
    count = sum(int((r[1] != IGNORE).sum()) for r in rows)
    total = torch.zeros((), dtype=F64)
    for x, labels, *documents in rows:
        with packed(model, documents[0] if documents else None):
            y = model(x).y
        flat = torch.nn.functional.cross_entropy(
            y.reshape(-1, y.shape[-1]), labels.reshape(-1), ignore_index=IGNORE, reduction="sum"
        )
        total = total + flat / count
    total.backward()
    return float(total), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _text(tmp_path: Path) -> Path:
    folder = tmp_path / "notes"
    folder.mkdir()
    for n in range(12):
        (folder / f"{n:02d}.txt").write_text(f"document {n}: " + "word " * (2 + 3 * (n % 5)))
    return folder


@pytest.mark.parametrize("engine", ["reference", "te"])
def test_a_packed_text_batch_is_its_documents_run_one_by_one(engine: str, tmp_path: Path) -> None:
    if engine == "te":
        pytest.importorskip("transformer_engine.pytorch", reason="the TE engine needs transformer-engine")
    plan = load("llama_tiny").checked_plan()  # rotary, grouped-query attention
    target = Target.of(engine, dtype=F64, seed=3, **({"kernels": "reference"} if engine == "te" else {}))
    model = target.build(plan, seed=3)
    data = DataSettings(path=str(_text(tmp_path)), packing=True, val_fraction=0.0)
    task = LanguageTask.prepare(plan, data, target, tokens=3 * 48, seq_len=48)
    batch = task.batch(1)
    assert batch.documents is not None and int(batch.documents.max()) >= 1  # several documents a row
    eot = task.corpus.tokenizer.eot_id
    assert bool((batch.target[batch.x == eot] == IGNORE).all())  # nothing predicted across an end
    packed_loss, packed_grads = _loss_and_grads(model, [(batch.x, batch.target, batch.documents)])
    alone = []
    for row, labels, documents in zip(batch.x, batch.target, batch.documents, strict=True):
        for d in documents.unique().tolist():
            keep = documents == d
            alone.append((row[keep][None], labels[keep][None]))
    separate_loss, separate_grads = _loss_and_grads(model, alone)
    assert packed_loss == pytest.approx(separate_loss, rel=1e-12)
    assert set(packed_grads) == set(separate_grads) and packed_grads
    for name, grad in packed_grads.items():
        torch.testing.assert_close(grad, separate_grads[name], rtol=1e-9, atol=1e-12)


def test_without_the_mask_the_documents_would_mix(tmp_path: Path) -> None:
    """The comparison has power: the same packed rows without their documents attend across them."""
    plan = load("llama_tiny").checked_plan()
    target = Target.of("reference", dtype=F64, seed=3)
    model = target.build(plan, seed=3)
    data = DataSettings(path=str(_text(tmp_path)), packing=True, val_fraction=0.0)
    batch = LanguageTask.prepare(plan, data, target, tokens=3 * 48, seq_len=48).batch(1)
    with packed(model, batch.documents):
        kept_apart = model(batch.x).y
    assert (model(batch.x).y - kept_apart).abs().max() > 1e-3


def test_positions_restart_at_each_document() -> None:
    documents = torch.tensor([[0, 0, 0, 1, 1, 2, -1, -1], [5, 5, 5, 5, 5, 5, 5, 5]])
    assert positions_in_documents(documents).tolist() == [[0, 1, 2, 0, 1, 0, 0, 1], list(range(8))]


def test_packed_conversations_keep_their_loss_mask(tmp_path: Path) -> None:
    import json

    from tests.language.test_chat import _imported_instruct

    model_dir = _imported_instruct(tmp_path)
    answers = ["hello there", "what is it", "it is", "hello"]
    lines = [
        {
            "messages": [
                {"role": "user", "content": "what is it " * (1 + n % 3)},
                {"role": "assistant", "content": answers[n % 4]},
            ]
        }
        for n in range(9)
    ]
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    from te_assembly.data.settings import TokenizerSettings

    tokenizer = TokenizerSettings(path=str(model_dir / "tokenizer.json"), eot="<|im_end|>")
    data = DataSettings(
        path=str(tmp_path / "chat.jsonl"), format="chat", tokenizer=tokenizer, val_fraction=0.0, packing=True
    )
    from te_assembly.formats.pretrained import from_pretrained

    model = from_pretrained(model_dir, Target.of("reference", dtype=F64))
    plan = model.plan
    packed_task = LanguageTask.prepare(plan, data, Target.of("reference"), tokens=2 * 64, seq_len=64)
    corpus = packed_task.corpus
    assert corpus.units < len(corpus.train)  # fewer rows than conversations
    x, labels, documents = corpus.rows_of(list(range(corpus.units)))
    one_each = [corpus.rows([example]) for example in corpus.train]
    assert int((labels != IGNORE).sum()) == sum(int((r[1] != IGNORE).sum()) for r in one_each)
    packed_loss, packed_grads = _loss_and_grads(model.train(), [(x, labels, documents)])
    separate_loss, separate_grads = _loss_and_grads(model, one_each)
    assert packed_loss == pytest.approx(separate_loss, rel=1e-12)
    for name, grad in packed_grads.items():
        torch.testing.assert_close(grad, separate_grads[name], rtol=1e-9, atol=1e-12)


def test_an_attention_that_cannot_keep_documents_apart_is_refused() -> None:
    model = Target.of("reference").build(load("deepseek_v3_tiny").checked_plan())
    with (
        pytest.raises(ArgumentError, match="LatentAttention"),
        packed(model, torch.zeros(1, 4, dtype=torch.long)),
    ):
        pass
