"""lm-evaluation-harness on te_assembly models: the same weights score what lm-eval's own ``hf`` model
scores (multiple choice, rolling perplexity, generation), request by request, through the Python API,
``eval SOURCE eval.tasks=[...]`` and lm-eval's own command line; offline, on local task files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

lm_eval = pytest.importorskip("lm_eval", reason="the harness tests need lm-eval (the eval extra)")
transformers = pytest.importorskip("transformers", reason="the harness tests compare with transformers")

from te_assembly.data.tokenizer import train_bpe  # noqa: E402
from te_assembly.errors import ArgumentError, MissingToolError  # noqa: E402
from te_assembly.jobs.eval.settings import EvalSettings  # noqa: E402
from te_assembly.jobs.harness.run import evaluate_tasks  # noqa: E402
from tests.conftest import REPO_ROOT, user_cli  # noqa: E402
from tests.harness.tasks import NAMES, WORDS, write_tasks  # noqa: E402
from tests.hf.tiny import make  # noqa: E402

OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
CONTEXT = 48
"""The models' max_position_embeddings: short, so rolling windows split the longer texts and a long
context loses tokens on the left, in both models alike."""


def _tokenizer(folder: Path, bos: bool) -> None:
    """A byte-level BPE saved as ``transformers`` saves a fast tokenizer; ``bos``: with a Llama-style
    post-processor that puts ``<s>`` first, and ``bos_token`` in ``tokenizer_config.json``."""
    from tokenizers import Tokenizer, processors

    trained = train_bpe([" ".join(WORDS) + "."] * 50, 290, "<|endoftext|>")
    trained.save(folder / "bpe.json")
    backend = Tokenizer.from_file(str(folder / "bpe.json"))
    (folder / "bpe.json").unlink()
    specials: dict[str, Any] = {"eos_token": "<|endoftext|>"}
    if bos:
        backend.add_special_tokens(["<s>"])
        start = backend.token_to_id("<s>")
        backend.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", start)]
        )
        specials["bos_token"] = "<s>"
    transformers.PreTrainedTokenizerFast(tokenizer_object=backend, **specials).save_pretrained(folder)


@pytest.fixture(scope="module")
def models(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A transformers Llama with its tokenizer (``bos``: one that adds a BOS; default ``plain``),
    imported by te_assembly, and the three tasks."""
    kind = getattr(request, "param", "plain")
    root = tmp_path_factory.mktemp(f"harness-{kind}")
    hf = make("llama", root / "hf", changes={"vocab_size": 300, "max_position_embeddings": CONTEXT})
    _tokenizer(hf, bos=kind == "bos")
    done = user_cli(root, "import-hf", "hf", "te")
    assert done.returncode == 0, done.stdout + done.stderr
    return {"root": root, "hf": hf, "te": root / "te", "tasks": write_tasks(root / "tasks")}


def _evaluate(model: str, args: str, tasks: Path, batch: int = 4) -> dict[str, Any]:
    from lm_eval.tasks import TaskManager

    import te_assembly.jobs.harness.model  # noqa: F401  (registers the model)

    result: dict[str, Any] = lm_eval.simple_evaluate(
        model=model,
        model_args=args,
        tasks=list(NAMES),
        task_manager=TaskManager(include_path=str(tasks)),
        batch_size=batch,
        device="cpu",
        log_samples=True,
    )
    return result


def _answers(result: dict[str, Any]) -> dict[str, list[Any]]:
    return {task: [s["resps"] for s in result["samples"][task]] for task in NAMES}


def _assert_same(ours: dict[str, Any], theirs: dict[str, Any]) -> None:
    """Every request's answer (log-likelihoods to float32's precision, greedy flags and generated text
    exactly) and every metric."""
    mine, hf = _answers(ours), _answers(theirs)
    for task in NAMES:
        for a, b in zip(mine[task], hf[task], strict=True):
            for x, y in zip(a, b, strict=True):
                if isinstance(y[0], str):
                    assert x == y, task
                elif isinstance(y[0], (tuple, list)):  # (log-likelihood, greedy)
                    assert x[0][0] == pytest.approx(y[0][0], rel=1e-5, abs=1e-4) and x[0][1] == y[0][1]
                else:  # a rolling log-likelihood
                    assert x[0] == pytest.approx(y[0], rel=1e-5)
        for metric, value in theirs["results"][task].items():
            if isinstance(value, float):
                assert ours["results"][task][metric] == pytest.approx(value, rel=1e-5), (task, metric)


@pytest.mark.parametrize("models", ["plain", "bos"], indirect=True)
def test_every_request_type_scores_what_lm_evals_hf_model_scores(models: dict[str, Path]) -> None:
    """Multiple choice (loglikelihood), rolling perplexity over several windows (loglikelihood_rolling)
    and greedy generation with stop strings (generate_until), with and without a BOS the tokenizer adds."""
    from lm_eval.models.huggingface import HFLM

    from te_assembly.jobs.harness.model import TEAssemblyLM

    hf_lm, our_lm = HFLM(pretrained=str(models["hf"]), device="cpu"), TEAssemblyLM(str(models["te"]))
    adds_bos = models["root"].name.startswith("harness-bos")
    assert (hf_lm.tok_encode("the fox")[0] == hf_lm.prefix_token_id) is adds_bos
    assert our_lm.tok_encode("the fox") == hf_lm.tok_encode("the fox")
    assert (
        our_lm.prefix_token_id == hf_lm.prefix_token_id and our_lm.max_length == hf_lm.max_length == CONTEXT
    )
    theirs = _evaluate("hf", f"pretrained={models['hf']},dtype=float32", models["tasks"])
    ours = _evaluate("te_assembly", f"pretrained={models['te']}", models["tasks"])
    _assert_same(ours, theirs)
    texts = [s["arguments"] for s in ours["samples"]["tiny_ppl"]]
    assert len(texts) == 6  # and the longest is several windows of CONTEXT tokens (tasks.py: 105 words)
    generated = [r[0][0] for r in _answers(ours)["tiny_gen"]]
    assert any(generated) and all("." not in g for g in generated)  # cut at the stop string


def test_batches_of_any_size_answer_alike(models: dict[str, Path]) -> None:
    """Right-padded rows of different lengths (log-likelihoods) and left-padded prompts through the
    key/value cache (generation) answer as each row alone."""
    one = _evaluate("te_assembly", f"pretrained={models['te']}", models["tasks"], batch=1)
    five = _evaluate("te_assembly", f"pretrained={models['te']},batch_size=5", models["tasks"], batch=1)
    _assert_same(five, one)


def test_eval_tasks_from_the_command_line_and_lm_evals_own(models: dict[str, Path]) -> None:
    """The docs' two commands as a user runs them, from a folder of their own: ``eval SOURCE
    eval.tasks=[...]`` writes lm-eval's results into the run's eval.json; lm-eval's command line with
    the model registered writes its own results file. Both equal the Python API's."""
    import shlex

    from tests.docs_text import block_after

    root = models["root"]
    (root / "my_model").unlink(missing_ok=True)
    (root / "my_model").symlink_to("te")
    (root / "my_tasks").unlink(missing_ok=True)
    (root / "my_tasks").symlink_to("tasks")
    ours, harness_line = (
        block_after("guides/language-models.md", "**lm-evaluation-harness**", "bash").strip().splitlines()
    )
    env = {**OFFLINE}
    done = user_cli(root, *shlex.split(ours)[3:], env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    written = json.loads(next((root / "outputs" / "my_model").glob("*/eval.json")).read_text())
    api = evaluate_tasks(
        root / "te", "auto", EvalSettings(tasks=["tiny_mc", "tiny_ppl"], include_path=str(root / "tasks"))
    )
    assert written["results"]["tiny_mc"]["acc,none"] == api["results"]["tiny_mc"]["acc,none"]
    assert written["results"]["tiny_ppl"]["word_perplexity,none"] == pytest.approx(
        api["results"]["tiny_ppl"]["word_perplexity,none"], rel=1e-9
    )
    readme = block_after("README.md", "**Benchmarks**", "bash").strip()
    (root / "tasks" / "my_task.yaml").write_text(
        (root / "tasks" / "tiny_mc.yaml").read_text().replace("task: tiny_mc", "task: my_task")
    )
    done = user_cli(root, *shlex.split(readme)[3:], env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "my_task" in done.stdout and "acc" in done.stdout
    words = shlex.split(harness_line)
    assert words[0] == "te-assembly-lm-eval"
    script = Path(sys.executable).parent / "te-assembly-lm-eval"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "te_assembly.jobs.harness"]
    run = subprocess.run(
        [*command, *words[1:], "--output_path", "lm_eval_out"],
        cwd=root,
        capture_output=True,
        text=True,
        env={**_env(), **env},
        timeout=600,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    (results,) = (root / "lm_eval_out").rglob("results_*.json")
    found = json.loads(results.read_text())["results"]
    assert found["tiny_mc"]["acc,none"] == api["results"]["tiny_mc"]["acc,none"]


def _env() -> dict[str, str]:
    import os

    return {**os.environ, "PYTHONPATH": str(REPO_ROOT)}


def test_unknown_tasks_and_bad_arguments_are_clean_errors(models: dict[str, Path]) -> None:
    root = models["root"]
    done = user_cli(
        root, "eval", "te", "eval.tasks=[tiny_mcc,nosuch_task]", "eval.include_path=tasks", env=OFFLINE
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "lm-eval has no task 'tiny_mcc' (did you mean 'tiny_mc'?)" in " ".join(done.stderr.split())
    assert "nosuch_task" in done.stderr
    from te_assembly.jobs.harness.model import TEAssemblyLM

    with pytest.raises(ArgumentError, match="does not take temperature"):
        TEAssemblyLM(str(models["te"]), temperature=0.5)


def test_without_the_extra_the_error_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from te_assembly.jobs.harness.run import harness

    monkeypatch.setitem(sys.modules, "lm_eval", None)
    with pytest.raises(MissingToolError, match=r"te_assembly\[eval\]"):
        harness()


def test_a_run_directory_and_its_checkpoint_score_alike(tmp_path: Path) -> None:
    """Any source te_assembly loads: a training run (its newest checkpoint) and the checkpoint file
    itself, byte-level tokenizer included, score the same as the model built in Python."""
    import te_assembly
    from te_assembly.jobs.generate.job import load_source

    done = user_cli(
        tmp_path,
        "train",
        "model=dense_lm",
        "model.dims.layers=1",
        "train.steps=2",
        "train.plot=false",
        "train.out_dir=run",
        "train.batch_tokens=256",
        "train.seq_len=32",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    tasks = write_tasks(tmp_path / "tasks")
    settings = EvalSettings(tasks=["tiny_mc", "tiny_ppl"], include_path=str(tasks), limit=3)
    from_run = evaluate_tasks(tmp_path / "run", "reference", settings, samples=True)
    (checkpoint,) = sorted((tmp_path / "run").glob("ckpt-*.safetensors"))
    from_file = evaluate_tasks(checkpoint, "reference", settings, samples=True)
    built = evaluate_tasks(load_source(str(checkpoint), "reference"), settings=settings, samples=True)
    assert _answers_of(from_run) == _answers_of(from_file) == _answers_of(built)
    assert isinstance(te_assembly.evaluate_tasks, type(evaluate_tasks))
    assert torch.isfinite(torch.tensor(from_run["results"]["tiny_ppl"]["bits_per_byte,none"]))


def _answers_of(result: dict[str, Any]) -> dict[str, list[Any]]:
    return {task: [s["resps"] for s in result["samples"][task]] for task in result["samples"]}
