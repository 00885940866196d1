"""The ``eval:`` section (pure Python: ``validate`` reads it without torch)."""

from __future__ import annotations

from dataclasses import dataclass

from te_assembly.analysis.head import CHUNK_TOKENS
from te_assembly.fields import FieldSpec
from te_assembly.sections import setting

SPLITS = ("all", "val")


@dataclass(frozen=True)
class EvalSettings:
    """``eval:``: the model to score, and the windows its text is scored in, or the lm-eval tasks it is
    scored on."""

    source: str | None = setting(
        None,
        nonempty=True,
        doc="a run directory (its newest good checkpoint), a checkpoint file or a pretrained directory",
    )
    seq_len: int | None = setting(
        None,
        minimum=2,
        doc="positions in each window, at most the model's context (null: 1024, or the model's context "
        "when shorter: an imported model's max_position_embeddings)",
    )
    stride: int | None = setting(
        None,
        minimum=1,
        doc="tokens between window starts (null: seq_len, windows side by side); smaller: each token "
        "scored once, with up to seq_len - stride tokens of context before it",
    )
    batch: int = setting(8, minimum=1, doc="windows per forward")
    loss_chunk_tokens: int | None = setting(
        CHUNK_TOKENS,
        minimum=1,
        doc="compute the vocabulary head and the loss this many tokens at a time, so a batch's logits "
        "never exist whole (null: whole)",
    )
    add_eot: bool = setting(
        True,
        doc="score the end-of-text token after each document, as training sees the text; false: the "
        "documents as one stream without it (transformers' perplexity of a text)",
    )
    split: str = setting(
        "all", choices=SPLITS, doc="all: every token of data.path; val: the held-out split a train run uses"
    )
    tasks: list[str] = setting(
        [],
        items=FieldSpec(str, nonempty=True),
        single_as_list=True,
        doc="lm-evaluation-harness tasks to score the model on (the [eval] extra), e.g. [hellaswag, "
        "wikitext]; empty: the loss on data.path",
    )
    include_path: str | None = setting(
        None, nonempty=True, doc="with tasks: a folder of your own lm-eval task YAML files"
    )
    num_fewshot: int | None = setting(
        None, minimum=0, doc="with tasks: examples shown before each question (null: each task's own)"
    )
    limit: int | None = setting(None, minimum=1, doc="with tasks: at most this many documents of each task")
    max_gen_toks: int = setting(256, minimum=1, doc="with tasks: tokens a generation task generates at most")


__all__ = ["SPLITS", "EvalSettings"]
