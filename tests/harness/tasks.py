"""Three lm-eval tasks on local JSON Lines files (no dataset downloaded), one per request type:
multiple choice (loglikelihood), rolling perplexity (loglikelihood_rolling) and generation
(generate_until)."""

from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = "the quick brown fox jumps over a lazy dog and then runs far away into green hills".split()

NAMES = ("tiny_mc", "tiny_ppl", "tiny_gen")


def _sentence(seed: int, length: int) -> str:
    # drawn, not cycled: lm-eval's hf model shares the logits of requests whose tokens are equal, which
    # a periodic text's rolling windows would be
    chosen = random.Random(seed)
    return " ".join(chosen.choice(WORDS) for _ in range(length))


def write_tasks(folder: Path, documents: int = 6) -> Path:
    """The three tasks' YAML files and data in ``folder`` (lm-eval's ``include_path``)."""
    folder.mkdir(parents=True, exist_ok=True)
    mc = [
        {
            "question": _sentence(n, 5) + ":",
            "choices": [" " + _sentence(n + k, 2) for k in range(4)],
            "answer": n % 4,
        }
        for n in range(documents)
    ]
    ppl = [{"text": _sentence(n, 40 + 13 * n) + "."} for n in range(documents)]
    gen = [{"prompt": _sentence(n, 6), "answer": " " + _sentence(n + 1, 1)} for n in range(documents)]
    for name, rows in (("mc", mc), ("ppl", ppl), ("gen", gen)):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = "dataset_path: json\ntest_split: test\n"
    (folder / "tiny_mc.yaml").write_text(
        f"task: tiny_mc\n{common}dataset_kwargs:\n  data_files:\n    test: {folder / 'mc.jsonl'}\n"
        "output_type: multiple_choice\ndoc_to_text: '{{question}}'\ndoc_to_choice: '{{choices}}'\n"
        "doc_to_target: '{{answer}}'\nmetric_list:\n  - metric: acc\n"
    )
    (folder / "tiny_ppl.yaml").write_text(
        f"task: tiny_ppl\n{common}dataset_kwargs:\n  data_files:\n    test: {folder / 'ppl.jsonl'}\n"
        "output_type: loglikelihood_rolling\ndoc_to_text: ''\ndoc_to_target: '{{text}}'\nmetric_list:\n"
        "  - metric: word_perplexity\n  - metric: byte_perplexity\n  - metric: bits_per_byte\n"
    )
    (folder / "tiny_gen.yaml").write_text(
        f"task: tiny_gen\n{common}dataset_kwargs:\n  data_files:\n    test: {folder / 'gen.jsonl'}\n"
        "output_type: generate_until\ndoc_to_text: '{{prompt}}'\ndoc_to_target: '{{answer}}'\n"
        "generation_kwargs:\n  until: ['.']\n  max_gen_toks: 6\n  do_sample: false\n"
        "metric_list:\n  - metric: exact_match\n"
    )
    return folder
