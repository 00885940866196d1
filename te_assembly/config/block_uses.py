"""Where each use of a block landed among the model's steps: what block expansion records and the plan
carries (``explain`` and ``graph`` collapse a block's uses by it; parameters are named by it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class BlockUse:
    """One use of a block: its steps are ``steps[first_step : first_step + num_steps]`` of the model,
    named ``<group>.<index>.<block step>``."""

    index: int
    first_step: int
    num_steps: int
    dims: dict[str, Any]
    """The block's dims for this use (defaults, then the model step's ``dims``, then this use's)."""

    @property
    def steps(self) -> range:
        return range(self.first_step, self.first_step + self.num_steps)


@dataclass(frozen=True)
class BlockGroup:
    """A model step that uses a block (``block: moe_layer``), expanded in place into the model's steps
    once per use."""

    name: str
    """The step's name; its steps, channels and public tensors are named ``<name>.<use>.<...>``."""
    block: str
    position: int
    """Index of the step in ``model.ops`` as written."""
    file: str | None
    """Where the block is defined: its own file, or the model's for one under ``model.blocks``."""
    uses: tuple[BlockUse, ...]

    def prefix(self, use: int) -> str:
        return f"{self.name}.{use}."

    @property
    def steps(self) -> range:
        if not self.uses:
            return range(0)
        return range(self.uses[0].first_step, self.uses[-1].first_step + self.uses[-1].num_steps)
