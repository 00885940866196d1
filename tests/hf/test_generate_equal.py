"""Generation with the key/value cache is transformers' greedy ``generate``, token for token: tiny random
checkpoints of every family made by transformers, imported, both in float64 (transformers' float32
islands removed, as in the Hugging Face comparison), one prompt and a batch of prompts of different
lengths (left padding, transformers' ``attention_mask``). And the cache changes nothing: the cached
logits equal a full forward's at every new position, in both the reference engine and (where TE is
installed) the TE engine."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from te_assembly.engines.target import Target
from te_assembly.errors import ResourceError
from te_assembly.formats.hf.convert import from_hf
from te_assembly.jobs.generate.decode import decode
from te_assembly.jobs.generate.job import next_token
from te_assembly.jobs.generate.settings import GenerateSettings
from te_assembly.jobs.verify_hf import float64_islands_removed, load_transformers
from tests.hf.tiny import FAMILIES

F64 = torch.float64
GREEDY = GenerateSettings(temperature=0, max_new_tokens=12)


def _prompts(vocab: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(3)
    return [torch.randint(3, vocab, (n,), generator=generator).tolist() for n in (7, 3, 10)]


def _theirs(hf_model: object, prompts: list[list[int]], new: int) -> list[list[int]]:
    """transformers' greedy generate of a left-padded batch (pad id 0, its attention mask)."""
    longest = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (longest - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in prompts])
    with float64_islands_removed(hf_model), torch.no_grad():
        out = hf_model.generate(  # type: ignore[attr-defined]
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[:, longest:].tolist()


@pytest.mark.parametrize("variant", [*FAMILIES, "mistral", "llama-rope-llama3", "llama-tied-mqa"])
def test_greedy_equals_transformers_generate(variant: str, hf_dir: Callable[[str], Path]) -> None:
    source = hf_dir(variant)
    mine = from_hf(source, Target.of("reference", dtype=F64))
    theirs = load_transformers(source, F64)
    prompts = _prompts(mine.plan.in_features)
    expected = _theirs(theirs, prompts, GREEDY.max_new_tokens)
    alone = [_theirs(theirs, [p], GREEDY.max_new_tokens)[0] for p in prompts]
    assert expected == alone  # transformers' own batch agrees with its single prompts
    batched = decode(mine, prompts, GREEDY, torch.Generator(), next_token, frozenset())
    assert batched.cached
    assert batched.ids == expected
    single = decode(mine, prompts[:1], GREEDY, torch.Generator(), next_token, frozenset())
    assert single.ids == expected[:1]


def _full_logits(model: object, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).y[0, -1]  # type: ignore[operator]


@pytest.mark.parametrize("engine", ["reference", pytest.param("te", marks=pytest.mark.te)])
@pytest.mark.parametrize("variant", ["mistral", "qwen3_moe", "llama-rope-llama3", "deepseek_v3", "gpt_oss"])
def test_cached_logits_equal_the_full_forward(
    engine: str, variant: str, hf_dir: Callable[[str], Path]
) -> None:
    """Every new position's logits through the cache equal a full forward over the whole sequence
    (the window of Mistral shorter than the sequence, RoPE scaling, qk-norm and experts included; DeepSeek's
    cached latent; GPT-OSS's sinks and alternating windows)."""
    if engine == "te":
        pytest.importorskip("transformer_engine.pytorch", reason="the TE engine needs transformer_engine")
    model = from_hf(
        hf_dir(variant), Target.of(engine, kernels="reference" if engine == "te" else "te", dtype=F64)
    )
    prompt = _prompts(model.plan.in_features)[0]
    seen: list[torch.Tensor] = []

    def choose(logits: torch.Tensor, settings: GenerateSettings, generator: torch.Generator) -> int:
        seen.append(logits.clone())
        return int(logits.argmax())

    out = decode(model, [prompt], GREEDY, torch.Generator(), choose, frozenset())
    history = list(prompt)
    for step, token in enumerate(out.ids[0]):
        torch.testing.assert_close(seen[step], _full_logits(model, history), rtol=1e-12, atol=1e-12)
        history.append(token)


def test_window_beyond_context_slides_and_recomputes(hf_dir: Callable[[str], Path]) -> None:
    """Past ``generate.context`` tokens the window slides: each token then comes from a full forward
    over the last ``context`` tokens (positions restart at its first), as without a cache."""
    model = from_hf(hf_dir("llama"), Target.of("reference", dtype=F64))
    prompt = _prompts(model.plan.in_features)[2]  # 10 tokens
    settings = GenerateSettings(temperature=0, max_new_tokens=8, context=12)
    out = decode(model, [prompt], settings, torch.Generator(), next_token, frozenset())
    history = list(prompt)
    for token in out.ids[0]:
        assert token == int(_full_logits(model, history[-12:]).argmax())
        history.append(token)


def test_stop_ids_end_each_row_alone(hf_dir: Callable[[str], Path]) -> None:
    model = from_hf(hf_dir("qwen2"), Target.of("reference", dtype=F64))
    prompts = _prompts(model.plan.in_features)
    free = decode(model, prompts, GREEDY, torch.Generator(), next_token, frozenset())
    stop = free.ids[1][4]  # the fifth token of the second row
    stopped = decode(model, prompts, GREEDY, torch.Generator(), next_token, frozenset({stop}))
    assert stopped.stopped[1] == stop
    assert stopped.ids[1] == free.ids[1][: free.ids[1].index(stop)]
    for row in (0, 2):  # the other rows go on, unchanged, up to their own first stop id
        cut = free.ids[row].index(stop) if stop in free.ids[row] else len(free.ids[row])
        assert stopped.ids[row] == free.ids[row][:cut]


def test_a_cache_that_cannot_fit_is_refused_before_allocating(
    hf_dir: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    model = from_hf(hf_dir("llama"), Target.of("reference", dtype=F64))
    monkeypatch.setenv("TE_ASSEMBLY_MEMORY_LIMIT", "1KiB")
    settings = GenerateSettings(temperature=0, max_new_tokens=100)
    with pytest.raises(ResourceError, match=r"key/value cache of 1 x 107 positions.*Nothing was allocated"):
        decode(model, [_prompts(96)[0]], settings, torch.Generator(), next_token, frozenset())


@pytest.mark.parametrize("cached", [True, False], ids=["cached", "uncached"])
@pytest.mark.parametrize("lengths", [(10,), (10, 3, 7), (13, 9)], ids=["one", "left-padded", "both-long"])
def test_a_prompt_longer_than_the_context_keeps_its_end(
    cached: bool, lengths: tuple[int, ...], hf_dir: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each row's logits at every new token equal a forward over that row alone, of its last
    ``context`` tokens (the most recent ones): in the first forward over the prompts, in the steps after
    it, for a left-padded batch, with the key/value cache and without one (a model that cannot cache)."""
    import te_assembly.jobs.generate.decode as decoding

    if not cached:
        monkeypatch.setattr(decoding, "cache_layouts", lambda model: [])
    model = from_hf(hf_dir("llama"), Target.of("reference", dtype=F64))
    generator = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, model.plan.in_features, (n,), generator=generator).tolist() for n in lengths]
    context = 6
    settings = GenerateSettings(temperature=0, max_new_tokens=5, context=context)
    seen: list[torch.Tensor] = []

    def choose(logits: torch.Tensor, settings: GenerateSettings, generator: torch.Generator) -> int:
        seen.append(logits.clone())
        return int(logits.argmax())

    out = decode(model, prompts, settings, torch.Generator(), choose, frozenset())
    assert out.cached == cached
    for row, prompt in enumerate(prompts):
        history = list(prompt)
        assert len(out.ids[row]) == settings.max_new_tokens
        for step, token in enumerate(out.ids[row]):
            expected = _full_logits(model, history[-context:])
            torch.testing.assert_close(seen[step * len(prompts) + row], expected, rtol=1e-12, atol=1e-12)
            history.append(token)
    assert not torch.allclose(
        _full_logits(model, prompts[0][:context]), _full_logits(model, prompts[0][-context:])
    )
