"""The token embedding both engines build for an ``Embedding`` step (TE has no fusible one)."""

from __future__ import annotations

import torch


class Embedding(torch.nn.Module):
    """``weight[ids]``: int64 ids ``[batch, seq]`` -> ``[batch, seq, embedding_dim]``. The call checks
    (``engines/call_checks.py``) have refused ids outside ``[0, num_embeddings)`` before this runs."""

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        init_std: float = 0.02,
        padding_idx: int | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim, self.init_std = num_embeddings, embedding_dim, init_std
        if padding_idx is not None and not 0 <= padding_idx < num_embeddings:
            raise ValueError(f"padding_idx={padding_idx} is not an id below num_embeddings={num_embeddings}")
        self.padding_idx = padding_idx
        self.weight = torch.nn.Parameter(
            torch.empty(num_embeddings, embedding_dim, device=device, dtype=dtype)
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # Small, as GPT-2 and Llama start theirs: a tied head then begins with logits near zero.
        torch.nn.init.normal_(self.weight, std=self.init_std)
        if self.padding_idx is not None:  # as torch.nn.Embedding starts its padding row
            with torch.no_grad():
                self.weight[self.padding_idx].zero_()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.embedding(ids, self.weight, padding_idx=self.padding_idx)

    def extra_repr(self) -> str:
        pad = f", padding_idx={self.padding_idx}" if self.padding_idx is not None else ""
        return f"{self.num_embeddings}, {self.embedding_dim}{pad}"
