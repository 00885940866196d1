"""A language model's head: the steps it ends with that run over chunks of tokens.

A loss over a large vocabulary needs one float32 row of ``vocab`` logits per token, which is most of
what a fine-tuning step holds (49,152 per token for SmolLM2). The steps a language model ends with, when
each computes a token's row from that token's row alone (the catalog's ``token_wise``: the final norm,
the vocabulary head, a soft-cap), can instead run over a thousand or so tokens at a time, the loss taken
per chunk (``engines/head_chunks.py``), so no more than one chunk of logits ever exists.

The head is the longest such run at the end of the model that lies outside every block use (a block use
is one unit to FSDP2 and to activation checkpointing), returns nothing to the caller but the main
output, and that no channel crosses into: a channel read inside it is produced inside it (a LoRA's
``x`` on the head). The fusers are cut where it begins (``fusers.py``), so the TE engine runs it as
fusers of its own. Pure Python: no torch, no TE.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from te_assembly.analysis.plan import PlannedStep

CHUNK_TOKENS = 1024
"""The default chunk (``train.loss_chunk_tokens``, ``eval.loss_chunk_tokens``): 200 MB of float32 logits
over a 49,152-token vocabulary, and large enough that the head's GEMM stays efficient
(``bench/chunked_loss.py``)."""


def head_start(steps: Sequence[PlannedStep | None], block_steps: Collection[int] = ()) -> int | None:
    """The position in ``steps`` where a language model's head begins (module docstring), or None: not a
    language model (no step takes token ids), or its last step cannot run per token."""
    if not any(s is not None and s.spec.needs_layout == "token_ids" for s in steps):
        return None
    start = len(steps)
    while start > 0:
        step = steps[start - 1]
        if step is None or step.index in block_steps or not step.spec.token_wise or any(step.output_public):
            break
        start -= 1
    while start < len(steps):
        crossing = _first_crossing(steps, start)
        if crossing is None:
            return start
        start = crossing + 1
    return None


def _first_crossing(steps: Sequence[PlannedStep | None], start: int) -> int | None:
    """The first position at or after ``start`` whose step reads a tensor from before ``start`` (a
    channel produced there, or a public input of the caller's)."""
    made: set[str] = set()
    for position in range(start, len(steps)):
        step = steps[position]
        assert step is not None
        if any(channel is None or channel not in made for channel in step.input_channels):
            return position
        made.update(channel for channel in step.output_channels if channel is not None)
    return None


__all__ = ["CHUNK_TOKENS", "head_start"]
