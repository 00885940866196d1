"""The multi-token prediction targets (``objective.ahead_labels``) and loss term: the token ``depth`` past
the next one, never past the row, never across a packed document's end, never onto a label the batch
ignores; and DeepSeek-V3's weighting (the mean over the modules, times ``mtp_weight``)."""

from __future__ import annotations

import torch

from te_assembly.jobs import objective

IGNORE = objective.IGNORE_INDEX


def _labels(ids: torch.Tensor) -> torch.Tensor:
    labels = ids.roll(-1, dims=-1)
    labels[..., -1] = IGNORE
    return labels


def test_each_position_targets_the_token_depth_past_the_next() -> None:
    ids = torch.arange(10, 20).reshape(1, 10)
    for depth in (1, 2, 3):
        ahead = objective.ahead_labels(_labels(ids), depth)
        kept = ahead[0] != IGNORE
        positions = torch.arange(10)[kept]
        assert torch.equal(ahead[0][kept], ids[0][positions + 1 + depth])
        assert kept.sum() == 10 - 1 - depth  # every position whose target lies in the row


def test_an_ignored_label_stays_ignored_where_it_lands() -> None:
    """A chat batch's prompt labels (and padding) are ignored: position i's target labels[i + depth] is
    ignored exactly when that label is."""
    ids = torch.arange(10).reshape(1, 10)
    labels = _labels(ids)
    labels[0, :4] = IGNORE  # the prompt's
    ahead = objective.ahead_labels(labels, 2)
    assert torch.equal(ahead[0, :8] == IGNORE, labels[0, 2:] == IGNORE)


def test_no_target_crosses_a_packed_documents_end() -> None:
    """Two documents side by side (labels at each one's last position already ignored, as packing
    writes them): no position of the first targets a token of the second."""
    documents = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1, 1]])
    ids = torch.arange(9).reshape(1, 9)
    labels = _labels(ids)
    labels[0, 3] = IGNORE  # the first document's last position has no next token of its own
    for depth in (1, 2):
        ahead = objective.ahead_labels(labels, depth, documents)
        for i in range(9):
            target = i + 1 + depth
            inside = target < 9 and documents[0, i] == documents[0, target]
            assert (ahead[0, i] != IGNORE) == inside, (depth, i)
        without = objective.ahead_labels(labels, depth)
        assert (without != IGNORE).sum() > (ahead != IGNORE).sum()  # the documents matter here


def test_the_mtp_term_is_the_weighted_mean_over_the_modules() -> None:
    torch.manual_seed(0)
    ids = torch.randint(0, 7, (2, 8))
    labels = _labels(ids)
    logits = torch.randn(2, 8, 7, dtype=torch.float64)
    extras = {
        "one": torch.randn(2, 8, 7, dtype=torch.float64),
        "two": torch.randn(2, 8, 7, dtype=torch.float64),
    }
    terms = objective.next_token_terms(logits, labels, extras, (), ahead={"one": 1, "two": 2}, mtp_weight=0.3)
    each = [
        objective.cross_entropy(extras[name], objective.ahead_labels(labels, depth))
        for name, depth in (("one", 1), ("two", 2))
    ]
    torch.testing.assert_close(terms[objective.MTP], 0.3 * (each[0] + each[1]) / 2, rtol=0, atol=1e-15)
    assert objective.MTP not in objective.next_token_terms(logits, labels, extras, (), ahead={"one": 1})
