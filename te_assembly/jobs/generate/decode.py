"""Token by token with a key/value cache: one forward over the prompts (left-padded to one length), then
one position per new token, each attention step attending to its cached past
(``engines/reference/kv_cache.py``). A model whose attention cannot be cached (no causal attention
step) recomputes its window each token (each row alone when the rows are padded: nothing would mask
the padding), as does every model once a sequence outgrows ``generate.context`` (the window slides:
positions restart at its first token; a longer prompt keeps its last ``context`` tokens)."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from te_assembly.engines.base import AssembledModel
from te_assembly.engines.memory import available_bytes, format_bytes
from te_assembly.engines.reference.kv_cache import Attention, KVCache, attending, cache_bytes, cache_layouts
from te_assembly.errors import ResourceError
from te_assembly.jobs.generate.settings import GenerateSettings
from te_assembly.jobs.window import DEFAULT

PAD = 0
"""The id fed where a sequence is padded or already finished (never attended to, never kept)."""

Choose = Callable[[torch.Tensor, GenerateSettings, torch.Generator], int]


@dataclass
class Decoded:
    """Each sequence's new ids, why it stopped, and the time the whole batch took."""

    ids: list[list[int]]
    stopped: list[int | None]
    """The stop id each sequence ended at (None: it reached ``max_new_tokens``)."""
    seconds: float = 0.0
    cached: bool = True
    finished: list[bool] = field(default_factory=list)


def decode(
    model: AssembledModel,
    prompts: Sequence[Sequence[int]],
    settings: GenerateSettings,
    generator: torch.Generator,
    choose: Choose,
    stop_ids: frozenset[int],
    on_token: Callable[[int, int], bool] | None = None,
) -> Decoded:
    """New ids for every prompt (each at least one id). ``choose(logits, settings, generator)`` picks
    one id from a position's logits; ``on_token(row, id)`` is told of each kept id and returns True to
    stop that row (a stop string)."""
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    context = settings.context or DEFAULT  # the generate job decides it (``jobs/window.py``)
    windows = [list(p[-context:]) for p in prompts]
    batch, longest = len(windows), max(len(w) for w in windows)
    capacity = min(context, longest + settings.max_new_tokens)
    layouts = cache_layouts(model)
    if not all(a.causal for a in layouts):
        layouts = []  # a later position would change earlier ones: every forward sees the whole window
    if layouts:
        _check_cache_fits(cache_bytes(layouts, batch, capacity, dtype), device, batch, capacity)
    out = Decoded([[] for _ in windows], [None] * batch, cached=bool(layouts), finished=[False] * batch)
    window = functools.partial(_forward, model, layouts, context, device, dtype)
    began = time.perf_counter()
    model.eval()
    with torch.no_grad():
        history = [list(w) for w in windows]
        logits, cache = window(history, capacity)
        for step in range(settings.max_new_tokens):
            chosen = []
            for row in range(batch):
                token = PAD if out.finished[row] else choose(logits[row], settings, generator)
                if not out.finished[row]:
                    if token in stop_ids:
                        out.stopped[row], out.finished[row] = token, True
                    else:
                        out.ids[row].append(token)
                        history[row].append(token)
                        if on_token is not None and on_token(row, token):
                            out.finished[row] = True
                chosen.append(token)
            if all(out.finished) or step == settings.max_new_tokens - 1:
                break
            if cache is not None and cache.length < cache.capacity:
                logits = _step(model, cache, chosen, device)
            else:  # outgrew the context: the window slides and is recomputed
                logits, cache = window(history)[0], None
    out.seconds = time.perf_counter() - began
    return out


def _check_cache_fits(needed: int, device: torch.device, batch: int, capacity: int) -> None:
    have = available_bytes(device)
    if have is not None and needed > have[0]:
        raise ResourceError(
            f"a key/value cache of {batch} x {capacity} positions needs {format_bytes(needed)} of "
            f"{device.type} memory, but only {format_bytes(have[0])} is available ({have[1]}); lower "
            "generate.max_new_tokens or generate.context. Nothing was allocated."
        )


def _padded(history: list[list[int]], context: int, device: torch.device) -> tuple[torch.Tensor, list[int]]:
    windows = [h[-context:] for h in history]
    longest = max(len(w) for w in windows)
    pads = [longest - len(w) for w in windows]
    ids = torch.tensor([[PAD] * p + w for p, w in zip(pads, windows, strict=True)], device=device)
    return ids, pads


def _forward(
    model: AssembledModel,
    layouts: list[Attention],
    context: int,
    device: torch.device,
    dtype: torch.dtype,
    history: list[list[int]],
    capacity: int | None = None,
) -> tuple[torch.Tensor, KVCache | None]:
    """The last position's logits ``[batch, vocab]`` of each sequence's window (its last ``context``
    tokens, left-padded to one length), and the cache that forward filled: one of ``capacity``
    positions to go on with (the prefill), or without one, a cache for this forward alone where
    padding must be masked (None when nothing is cached)."""
    ids, pads = _padded(history, context, device)
    if not layouts and any(pads):  # nothing masks the padding: each row alone, as it is
        return torch.cat([model(ids[row : row + 1, pad:]).y[:, -1] for row, pad in enumerate(pads)]), None
    if not layouts or (capacity is None and not any(pads)):
        return model(ids).y[:, -1], None
    cache = KVCache(layouts, len(history), capacity or ids.shape[1], device, dtype, pads=pads)
    with attending(model, cache):
        y = model(ids).y[:, -1]
    cache.advance(ids.shape[1])
    return y, cache


def _step(model: AssembledModel, cache: KVCache, chosen: list[int], device: torch.device) -> torch.Tensor:
    ids = torch.tensor(chosen, dtype=torch.int64, device=device)[:, None]
    with attending(model, cache):
        y = model(ids).y[:, -1]
    cache.advance(1)
    return y


__all__ = ["PAD", "Decoded", "decode"]
