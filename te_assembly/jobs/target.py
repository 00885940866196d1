"""Where and how a job runs: one frozen ``Target`` (engine, kernels, device, dtype, recipe, parallel
layout, seed), resolved once from the settings, and the operations every job needs, written once.

A job (``run``, ``verify``, ``train``, ``bench``) takes a plan, a target and its own settings section;
it builds through ``target.build``, samples through ``target.sample``, checks memory through
``target.check_fits``, makes its optimizer through ``make_optimizer`` and copies weights through
``copy_weights``. None of them reads the seven runtime settings again.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from te_assembly.analysis.parallel.settings import TE_SHARDED_EXPERTS, TE_SHARDED_EXPERTS_HINT
from te_assembly.analysis.plan import Plan
from te_assembly.analysis.recipes import Recipe, checked_recipe
from te_assembly.analysis.settings import CommonSettings
from te_assembly.diagnostics import error
from te_assembly.engines import build, check_device, check_dtype, resolve_engine
from te_assembly.engines.base import AssembledModel
from te_assembly.engines.data import DEFAULT_SEQ_LEN, sample_public_inputs, sample_x
from te_assembly.engines.memory import (
    available_bytes,
    check_fits,
    fused_attention,
    rank_estimate,
    what_would_fit,
)
from te_assembly.engines.parallel.context import ParallelContext
from te_assembly.errors import ConfigError, VerificationError

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
}
"""The torch dtype of each ``dtype`` setting (``analysis.settings.DTYPES`` names them)."""

NO_RECIPE = Recipe({"kind": "none", "name": "none"})
"""What ``recipe=null`` stands for: no quantization."""


def resolve_device(name: str | torch.device) -> torch.device:
    """``auto`` is CUDA when a GPU is visible, else CPU; anything else as ``build()`` checks its
    ``device``."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return check_device(name)


@dataclass(frozen=True)
class Target:
    """The runtime a job runs on. ``engine`` is resolved (``reference`` or ``te``, never ``auto``);
    ``recipe`` is the run's quantization recipe (``NO_RECIPE`` for none), which only the TE engine
    applies; ``parallel`` is this process's part of the ``parallel`` layout, or None for one process."""

    engine: str
    kernels: str = "te"
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    dtype: torch.dtype = torch.float32
    recipe: Recipe = field(default_factory=lambda: NO_RECIPE)
    seed: int = 0
    parallel: ParallelContext | None = None
    compile: bool = False
    """``torch.compile`` of each unit (reference engine; ``compile`` setting)."""
    reason: str = field(default="", compare=False)
    """Why this engine (``engine=auto`` says what it found), for the first line a command prints."""

    # ------------------------------------------------------------------------------------ making one

    @classmethod
    def of(
        cls,
        engine: str = "auto",
        kernels: str = "te",
        device: str | torch.device | None = "cpu",
        dtype: torch.dtype = torch.float32,
        recipe: Mapping[str, Any] | None = None,
        seed: int = 0,
        parallel: ParallelContext | None = None,
        compile: bool = False,
    ) -> Target:
        """A target from Python values (``engine='auto'`` resolved here); ``ArgumentError`` or
        ``ConfigError`` for values no job could run with."""
        chosen, reason = resolve_engine(engine, kernels)
        if compile and chosen == "te":
            from te_assembly.engines.base import COMPILE_REFUSED

            raise ConfigError(
                [
                    error(
                        "compile",
                        "conflicting-settings",
                        f"engine=auto chose te ({reason}): {COMPILE_REFUSED}",
                    )
                ]
            )
        return cls(
            engine=chosen,
            kernels=kernels,
            device=resolve_device(device if device is not None else "cpu"),
            dtype=check_dtype(dtype),
            recipe=checked_recipe(recipe) if recipe is not None else NO_RECIPE,
            seed=seed,
            parallel=parallel,
            compile=compile,
            reason=reason,
        )

    @classmethod
    def from_settings(cls, common: CommonSettings, recipe: Mapping[str, Any] | None) -> Target:
        """The target the top-level settings (engine, kernels, device, dtype, seed) and the config's
        recipe describe."""
        return cls.of(
            common.engine,
            common.kernels,
            common.device,
            DTYPES[common.dtype],
            recipe,
            common.seed,
            compile=common.compile,
        )

    @contextlib.contextmanager
    def distributed(
        self,
        plan: Plan,
        settings: Any,
        *,
        command: str,
        tokens: tuple[str, int],
        seq_len: int | None = None,
        layout: Any = None,
    ) -> Iterator[Target]:
        """This target on this process's part of the ``parallel`` layout (``settings``, the section),
        for the duration of ``command``: process groups started and torn down, launch and ``tokens``,
        (key, rows per batch), checked first; whole sequences of ``seq_len`` rows each when the model
        takes ``[batch, seq, features]``. One process: a single-process context, nothing started."""
        from te_assembly.engines.parallel.runtime import parallel_run

        if self.engine == "te" and settings.shard > 1 and settings.expert > 1:
            asked = not self.reason or self.reason.endswith("(asked for)")
            why = "" if asked else f"engine=auto chose te ({self.reason}): "
            raise ConfigError(
                [
                    error(
                        "parallel.shard",
                        "conflicting-settings",
                        why + TE_SHARDED_EXPERTS,
                        TE_SHARDED_EXPERTS_HINT,
                    )
                ]
            )
        sequences = seq_len if plan.takes_sequences else None
        with parallel_run(
            plan, settings, self.device, command=command, tokens=tokens, layout=layout, seq_len=sequences
        ) as par:
            yield dataclasses.replace(self, parallel=par, device=par.device(self.device))

    # ------------------------------------------------------------------------------------- reading it

    @property
    def engine_recipe(self) -> Recipe | None:
        """The recipe ``build`` gets: the TE engine runs its forwards under its ``te.autocast``; the
        reference engine has none."""
        return self.recipe if self.engine == "te" else None

    @property
    def te_kernels(self) -> bool:
        """TE's own kernels (not our reference math inside TE's fusers)."""
        return self.engine == "te" and self.kernels == "te"

    @property
    def te_gemms(self) -> bool:
        """GEMMs in TE's kernels on a GPU, where float32 runs as TF32."""
        return self.te_kernels and self.device.type == "cuda"

    @property
    def fused_attention(self) -> bool:
        """Attention in TE's fused kernels (no probabilities kept for backward)."""
        return fused_attention(self.engine, self.kernels, self.device, self.dtype)

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    def context(self, plan: Plan) -> ParallelContext:
        """The parallel context jobs call (``local_rows``, ``wrap``, ``mean``...): the target's own, or
        one process's."""
        return self.parallel if self.parallel is not None else ParallelContext.single(plan)

    @property
    def is_parallel(self) -> bool:
        return self.parallel is not None and self.parallel.is_parallel

    # ---------------------------------------------------------------------------- what jobs do with it

    def check_fits(
        self,
        plan: Plan,
        what: str,
        hint: str,
        *,
        tokens: int = 0,
        models: int = 1,
        trained: int = 0,
        optimizer: str | None = None,
        seq_len: int | None = None,
        fused: bool | None = None,
        checkpointing: str = "none",
    ) -> None:
        """``ResourceError`` before anything is allocated when ``models`` copies of ``plan`` (``trained``
        of them with gradients and ``optimizer`` state) and one batch of ``tokens`` rows cannot fit the
        target's device (``engines/memory.py``), for this rank of the target's parallel layout (its
        slices, FSDP2 pieces and rows; ``checkpointing``: ``train.activation_checkpointing``). ``fused``:
        whether attention runs in TE's fused kernels (default: as the target does). A refused training
        run is told which ``parallel.shard`` or activation checkpointing would make it fit."""
        layout = self.context(plan).layout
        options: dict[str, Any] = {
            "tokens": tokens,
            "models": models,
            "trained": trained,
            "optimizer": optimizer,
            "seq_len": seq_len,
            "fused_attention": self.fused_attention if fused is None else fused,
            "one_unit": self.engine == "te",  # the TE engine is sharded as one FSDP2 unit (fsdp.py)
        }
        needed = rank_estimate(plan, layout, self.dtype, checkpointing=checkpointing, **options)
        have = available_bytes(self.device)
        if have is None or needed.total <= have[0]:
            return
        if trained:
            fixes = what_would_fit(plan, layout, self.dtype, have[0], checkpointing, **options)
            if fixes:
                hint = f"{hint}; it fits with {' or '.join(fixes)}"
        check_fits(needed, self.device, what, hint, have)

    def build(
        self,
        plan: Plan,
        *,
        seed: int | None = None,
        engine: str | None = None,
        split: bool = True,
        activation_checkpointing: str = "none",
    ) -> AssembledModel:
        """``plan`` as a model on this target. ``seed``: seeds torch's generator first (the weights);
        ``engine``: another engine on the same device and dtype (``verify`` builds both);
        ``split=False``: the whole model even under a parallel layout (a teacher);
        ``activation_checkpointing``: ``train.activation_checkpointing``. The target's ``compile`` applies
        to the reference engine."""
        if seed is not None:
            torch.manual_seed(seed)
        chosen = engine or self.engine
        parallel = self.parallel if split and self.is_parallel else None
        model = build(
            plan,
            engine=chosen,
            kernels=self.kernels,
            device=self.device,
            dtype=self.dtype,
            recipe=self.recipe if chosen == "te" else None,
            parallel=parallel,
        )
        compiled = self.compile and chosen == "reference"
        if compiled or activation_checkpointing != "none":
            model.configure(activation_checkpointing=activation_checkpointing, compile=compiled)
        return model

    def sample(
        self,
        plan: Plan,
        tokens: int,
        generator: torch.Generator,
        seq_len: int = DEFAULT_SEQ_LEN,
        *,
        local: bool = True,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """A synthetic batch of ``tokens`` rows: ``x`` and every public input (``engines/data.py``),
        drawn from ``generator`` on the CPU so every device sees the same numbers. ``local``: under a
        parallel layout, this rank's rows of it."""
        kw: dict[str, Any] = {"generator": generator, "device": self.device, "dtype": self.dtype}
        x = sample_x(plan, tokens, seq_len=seq_len, **kw)
        inputs = sample_public_inputs(plan, tokens, seq_len=seq_len, **kw)
        if local and self.is_parallel:
            assert self.parallel is not None
            x, inputs = self.parallel.local_rows(x), self.parallel.local_inputs(inputs)
        return x, inputs

    def sync(self) -> None:
        """Wait for the device's queued work, so a timer reads finished work."""
        synchronize(self.device)


def synchronize(device: torch.device) -> None:
    """``torch.cuda.synchronize`` on a GPU; CPU work is synchronous already."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------------------------------- optimizer


@dataclass(frozen=True)
class OptimizerSpec:
    """The optimizer of ``train`` and of ``bench``'s full-step phase. ``bench`` names only ``optimizer``
    and ``lr``; the rest are ``train``'s defaults, so a benchmarked step is a trained step."""

    name: str = "adamw"
    lr: float = 3e-3
    weight_decay: float = 0.0
    """Decoupled weight decay (adamw) or L2 (sgd)."""
    momentum: float = 0.9
    """sgd only."""


class NothingToStep:
    """The optimizer of a model without parameters: ``step`` has nothing to update (torch's optimizers
    refuse an empty parameter list)."""

    param_groups: list[dict[str, Any]] = []

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass

    def step(self) -> None:
        pass


def make_optimizer(
    params: Iterable[torch.nn.Parameter], spec: OptimizerSpec
) -> torch.optim.Optimizer | NothingToStep:
    """The optimizer over the trainable ``params``; ``ValueError`` for a name there is none of."""
    trainable = [p for p in params if p.requires_grad]
    if not trainable:
        return NothingToStep()
    if spec.name == "adamw":
        return torch.optim.AdamW(trainable, lr=spec.lr, weight_decay=spec.weight_decay)
    if spec.name == "sgd":
        return torch.optim.SGD(trainable, lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay)
    raise ValueError(f"unknown optimizer {spec.name!r} (adamw | sgd)")


# ------------------------------------------------------------------------------------------ weights

EXTRA_STATE = "._extra_state"
"""TE ops' state-dict entries of quantization metadata (FP8 scales, amax history): no other engine
has them."""


def _engine_name(model: torch.nn.Module) -> str:
    return str(getattr(model, "engine", type(model).__name__))


def copy_weights(source: torch.nn.Module, target: torch.nn.Module) -> None:
    """Load ``source``'s weights into ``target``. Strict: the two state dicts hold the same names, every
    parameter and buffer, or ``VerificationError`` names what is only in one. The one exception is TE's
    ``_extra_state`` entries (quantization metadata, which no other engine has): never copied, and the
    target keeps its own."""
    src = {k: v for k, v in source.state_dict().items() if not k.endswith(EXTRA_STATE)}
    tgt = target.state_dict()
    own_extra = {k: v for k, v in tgt.items() if k.endswith(EXTRA_STATE)}
    missing = sorted(set(tgt) - set(own_extra) - set(src))
    unexpected = sorted(set(src) - set(tgt))
    if missing or unexpected:
        a, b = _engine_name(source), _engine_name(target)
        raise VerificationError(
            f"parameter names differ between the {a} and {b} engines: "
            f"only in {b}: {missing or 'none'}; only in {a}: {unexpected or 'none'}"
        )
    target.load_state_dict({**src, **own_extra}, strict=True)


__all__ = [
    "DTYPES",
    "NO_RECIPE",
    "NothingToStep",
    "OptimizerSpec",
    "Target",
    "copy_weights",
    "make_optimizer",
    "resolve_device",
    "synchronize",
]
