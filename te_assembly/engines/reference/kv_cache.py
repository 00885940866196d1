"""A key/value cache for generation: each attention step keeps the keys and values it has computed, so
a new token costs one position's forward instead of the whole sequence's.

Every step of a te_assembly language model but ``Attention`` works position by position, so a model
fed only the new positions computes what the full forward computes for them, as long as each attention
step attends to the cached keys and values of the earlier positions. ``KVCache`` holds them for a
batch of sequences, left-padded to one length: sequence ``b`` starts after ``pads[b]`` padding
positions, its tokens take rotary positions from 0 there (as ``transformers`` numbers a left-padded
batch), and no query attends to a padding key. ``with attending(model, cache):`` hands the cache to
every attention step of ``model`` (the reference ``Attention``, and the TE engine's ``TEAttention``,
whose fusers run the rest unchanged); after each forward the caller calls ``cache.advance(n)``.

Keys and values are kept in the attention's compute dtype (float32 at least, as the uncached forward
computes them), so a cached step computes from the very numbers a full forward would.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import torch

from te_assembly.engines.memory import format_bytes
from te_assembly.engines.reference.ops.base import compute_dtype
from te_assembly.engines.reference.rotary import apply_rotary, cos_sin
from te_assembly.errors import ArgumentError


class Attention(Protocol):
    """What the cache reads of an attention step's reference module (``attention.Attention``, which
    imports this module, or ``latent_attention.LatentAttention``): what it keeps, the rotary angles."""

    num_heads: int
    rotary_dim: int
    causal: bool
    sliding_window: int | None
    has_sinks: bool

    @property
    def softmax_scale(self) -> float | None: ...

    @property
    def rope(self) -> Any: ...

    @property
    def cached(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """(heads, features) of the two tensors kept per position: keys and values (``Attention``), or
        the compressed latent and the shared rotated key (``LatentAttention``)."""
        ...


def cache_layouts(model: torch.nn.Module) -> list[Attention]:
    """The reference ``Attention`` of every attention step in ``model``, in order: the step itself, or
    (the TE engine's ``TEAttention``) the reference module whose shapes it uses, its ``layout``."""
    return [m.cache_layout for m in model.modules() if hasattr(m, "use_cache")]  # type: ignore[misc]


def cache_bytes(layouts: Sequence[Attention], batch: int, capacity: int, dtype: torch.dtype) -> int:
    """What a cache of ``capacity`` positions for ``batch`` sequences holds: the two tensors of every
    attention step, ``[batch, heads, capacity, features]`` each (``Attention.cached``), in the compute
    dtype."""
    width = compute_dtype(dtype).itemsize
    return sum(batch * heads * capacity * features * width for a in layouts for heads, features in a.cached)


class KVCache:
    """Keys and values of ``layouts`` for ``batch`` sequences of at most ``capacity`` positions
    (module docstring). ``pads``: each sequence's left padding (default none)."""

    def __init__(
        self,
        layouts: Sequence[Attention],
        batch: int,
        capacity: int,
        device: torch.device,
        dtype: torch.dtype,
        pads: Sequence[int] | None = None,
    ) -> None:
        if not layouts:
            raise ArgumentError("the model has no attention step: there is nothing to cache")
        acausal = [a for a in layouts if not a.causal]
        if acausal:
            raise ArgumentError(
                "a key/value cache needs causal attention: a later token would change earlier ones"
            )
        self.batch, self.capacity, self.length = batch, capacity, 0
        self.dtype = compute_dtype(dtype)
        pads = list(pads) if pads is not None else [0] * batch
        if len(pads) != batch or any(p < 0 or p >= capacity for p in pads):
            raise ArgumentError(f"pads {pads}: one per sequence, each less than the capacity {capacity}")
        self.pads = torch.tensor(pads, dtype=torch.int64, device=device)
        self.padded = any(pads)
        self._store: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for a in layouts:
            (heads_k, width_k), (heads_v, width_v) = a.cached
            self._store[id(a)] = (
                torch.empty((batch, heads_k, capacity, width_k), device=device, dtype=self.dtype),
                torch.empty((batch, heads_v, capacity, width_v), device=device, dtype=self.dtype),
            )
        self._angles: dict[tuple[int, int], torch.Tensor] = {}

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self._store.values())

    def __repr__(self) -> str:
        return (
            f"KVCache({len(self._store)} attention steps, {self.batch} x {self.length}/{self.capacity} "
            f"positions, {format_bytes(self.nbytes)})"
        )

    def advance(self, new: int) -> None:
        """The forward that added ``new`` positions is over: they are part of the past now."""
        if self.length + new > self.capacity:
            raise ArgumentError(f"the cache holds {self.capacity} positions, not {self.length + new}")
        self.length += new

    def positions(self, new: int) -> torch.Tensor:
        """``[batch, new]`` rotary positions of the next ``new`` positions (padding: 0)."""
        index = torch.arange(self.length, self.length + new, device=self.pads.device)
        return (index[None, :] - self.pads[:, None]).clamp_min(0)

    def rotated(
        self, layout: Attention, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``q`` and ``k`` ``[b, new, heads, d]`` rotated at their positions: the float32 angles of the
        uncached forward's table, indexed (so each rounding is the one a full forward makes)."""
        key = (id(layout.rope), layout.rotary_dim)
        table = self._angles.get(key)
        if table is None:
            table = layout.rope.angles(self.capacity, layout.rotary_dim, q.device)
            self._angles[key] = table
        angles = table[self.positions(q.shape[1])]  # [b, new, d]
        cos, sin = cos_sin(angles, layout.rope.scale, q.dtype)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)

    def append(
        self, layout: Attention, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``k`` and ``v`` ``[b, heads, new, d]`` (``layout.cached``'s shapes) after the past; all
        kept so far."""
        keys, values = self._store[id(layout)]
        end = self.length + k.shape[2]
        if end > self.capacity:
            raise ArgumentError(f"the cache holds {self.capacity} positions, not {end}")
        keys[:, :, self.length : end] = k
        values[:, :, self.length : end] = v
        return keys[:, :, :end], values[:, :, :end]

    def mask(self, new: int, window: int | None) -> torch.Tensor | None:
        """``[batch, 1, new, length + new]``: which keys each new query sees (None: every earlier one,
        the common decode case). A padding query sees itself only, so no softmax row is empty."""
        end = self.length + new
        if not self.padded and window is None and new == 1:
            return None
        device = self.pads.device
        query = torch.arange(self.length, end, device=device)[:, None]
        key = torch.arange(end, device=device)[None, :]
        seen = key <= query
        if window is not None:
            seen = seen & (query - key < window)
        seen = seen[None] & (key[None] >= self.pads[:, None, None])
        return (seen | (key == query)[None])[:, None]


def attend(layout: Any, qkv: torch.Tensor, cache: KVCache, rotary: bool) -> torch.Tensor:
    """``layout``'s attention of the new positions in ``qkv`` over the cached past and themselves:
    what the full forward computes at those positions."""
    out_dtype = qkv.dtype
    q, k, v = layout.split_heads(qkv.to(cache.dtype), rotate=False)
    if rotary:
        q, k = cache.rotated(layout, q, k)
    batch, new = q.shape[0], q.shape[1]
    keys, values = cache.append(layout, k.transpose(1, 2), v.transpose(1, 2))
    window = layout.sliding_window
    mask = cache.mask(new, window if window is not None and window < cache.capacity else None)
    # Query head i reads key/value head i // group (enable_gqa: the grouping of repeat_interleave,
    # without copying the cache for every group each token).
    gqa = layout.num_heads != layout.num_kv_heads
    if getattr(layout, "written_out", False):
        out = layout.attend_written_out(q.transpose(1, 2), keys, values, mask)
    else:
        out = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), keys, values, attn_mask=mask, enable_gqa=gqa, scale=layout.softmax_scale
        )
    return out.transpose(1, 2).reshape(batch, new, layout.num_heads * layout.head_dim).to(out_dtype)


@contextlib.contextmanager
def attending(model: torch.nn.Module, cache: KVCache) -> Iterator[KVCache]:
    """Every attention step of ``model`` attends through ``cache`` inside (module docstring)."""
    steps: list[Any] = [m for m in model.modules() if hasattr(m, "use_cache")]
    for step in steps:
        step.use_cache(cache)
    try:
        yield cache
    finally:
        for step in steps:
            step.use_cache(None)


__all__ = ["KVCache", "attend", "attending", "cache_bytes", "cache_layouts"]
