"""Where and how a model runs: one frozen ``Target`` (engine, kernels, device, dtype, recipe, seed,
parallel layout, compile), resolved once, and the operations every job and loader needs, written once:
``check_fits`` (the memory estimate, before anything is allocated), ``build`` (the plan assembled in
the target's engine), ``sample`` (a synthetic batch) and ``sync``.

The runtime tuple lives here and nowhere else: ``te_assembly.build``, the loaders
(``from_pretrained``, ``from_checkpoint``, ``from_hf``) and every job take a ``Target`` (or an engine
name, ``Target.of(name)``), never the seven values one by one.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from te_assembly.analysis.parallel.settings import TE_SHARDED_EXPERTS, TE_SHARDED_EXPERTS_HINT
from te_assembly.analysis.plan import Plan
from te_assembly.analysis.recipes import Recipe, checked_recipe
from te_assembly.analysis.settings import CommonSettings
from te_assembly.collector import paused
from te_assembly.diagnostics import error
from te_assembly.engines.base import COMPILE_REFUSED, AssembledModel
from te_assembly.engines.choice import check_device, check_dtype, resolve_engine, te_available
from te_assembly.engines.data import DEFAULT_SEQ_LEN, sample_public_inputs, sample_x
from te_assembly.engines.memory import (
    available_bytes,
    check_fits,
    estimate,
    fused_attention,
    rank_estimate,
    what_would_fit,
)
from te_assembly.engines.parallel.context import ParallelContext
from te_assembly.errors import ArgumentError, ConfigError, EngineUnavailableError

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
}
"""The torch dtype of each ``dtype`` setting (``analysis.settings.DTYPES`` names them)."""

NO_RECIPE = Recipe({"kind": "none", "name": "none"})
"""No recipe given: a build from a config uses the config's own, a loader the saved one; otherwise no
quantization. ``recipe=null`` on the command line is this too."""


def resolve_device(name: str | torch.device) -> torch.device:
    """``auto`` is CUDA when a GPU is visible, else CPU; anything else as ``check_device`` takes it."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return check_device(name)


@dataclass(frozen=True)
class Target:
    """The runtime a model is built and run on. ``engine`` is resolved (``reference`` or ``te``, never
    ``auto``); ``recipe`` is the TE engine's quantization recipe (``NO_RECIPE``: none given), which the
    reference engine ignores; ``seed`` seeds a job's weights and data (``build`` alone never draws it);
    ``parallel`` is this process's part of the ``parallel`` layout, or None for one process."""

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
        ``ConfigError`` for values no model could run with."""
        if recipe is not None and not isinstance(recipe, Mapping):
            raise ArgumentError(
                f"recipe must be a mapping (a recipe config) or None; got {type(recipe).__name__}"
            )
        chosen, reason = resolve_engine(engine, kernels)
        if compile and chosen == "te":
            message = f"engine=auto chose te ({reason}): {COMPILE_REFUSED}"
            raise ConfigError([error("compile", "conflicting-settings", message)])
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
        """The target the top-level settings (engine, kernels, device, dtype, seed, compile) and the
        config's recipe describe."""
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
        config_sha256: str | None = None,
    ) -> Iterator[Target]:
        """This target on this process's part of the ``parallel`` layout (``settings``, the section),
        for the duration of ``command``: process groups started and torn down, launch and ``tokens``,
        (key, rows per batch), checked first; whole sequences of ``seq_len`` rows each when the model
        takes ``[batch, seq, features]``. One process: this target as it is, nothing started."""
        from te_assembly.engines.parallel.runtime import parallel_run

        if self.engine == "te" and settings.shard > 1 and settings.expert > 1:
            asked = not self.reason or self.reason.endswith("(asked for)")
            why = "" if asked else f"engine=auto chose te ({self.reason}): "
            message = why + TE_SHARDED_EXPERTS
            raise ConfigError(
                [error("parallel.shard", "conflicting-settings", message, TE_SHARDED_EXPERTS_HINT)]
            )
        sequences = seq_len if plan.takes_sequences else None
        with parallel_run(
            plan,
            settings,
            self.device,
            command=command,
            tokens=tokens,
            layout=layout,
            seq_len=sequences,
            config_sha256=config_sha256,
        ) as par:
            if not par.is_parallel and par.settings.fail_on_rank is None:
                yield self  # one process: no context, no collective bookkeeping in any job
                return
            yield dataclasses.replace(self, parallel=par, device=par.device(self.device))

    # ------------------------------------------------------------------------------------- reading it

    @property
    def engine_recipe(self) -> Recipe | None:
        """The recipe the TE engine runs its forwards under (``te.autocast``); the reference engine has
        none."""
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

    @property
    def is_parallel(self) -> bool:
        return self.parallel is not None and self.parallel.is_parallel

    def context(self, plan: Plan) -> ParallelContext:
        """The parallel context of a parallel target, or one process's (what ``explain``'s per-rank
        numbers and the memory estimate read)."""
        return self.parallel if self.parallel is not None else ParallelContext.single(plan)

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
        chunk_tokens: int | None = None,
    ) -> None:
        """``ResourceError`` before anything is allocated when ``models`` copies of ``plan`` (``trained``
        of them with gradients and ``optimizer`` state) and one batch of ``tokens`` rows cannot fit the
        target's device (``engines/memory.py``), for this rank of the target's parallel layout (its
        slices, FSDP2 pieces and rows; ``checkpointing``: ``train.activation_checkpointing``). ``fused``:
        whether attention runs in TE's fused kernels (default: as the target does); ``chunk_tokens``: a
        language model's head and loss run that many tokens at a time (``engines/head_chunks.py``). A
        refused training run is told which ``parallel.shard`` or activation checkpointing would make it
        fit. Each job calls this once, with everything it will hold, before it builds anything."""
        options: dict[str, Any] = {
            "tokens": tokens,
            "models": models,
            "trained": trained,
            "optimizer": optimizer,
            "seq_len": seq_len,
            "fused_attention": self.fused_attention if fused is None else fused,
            "chunk_tokens": chunk_tokens,
        }
        if self.parallel is None:
            needed = estimate(plan, self.dtype, checkpointing=checkpointing, **options)
        else:  # the TE engine is sharded as one FSDP2 unit (fsdp.py)
            layout = self.parallel.layout
            needed = rank_estimate(
                plan, layout, self.dtype, checkpointing=checkpointing, one_unit=self.engine == "te", **options
            )
        have = available_bytes(self.device)
        if have is None or needed.total <= have[0]:
            return
        if trained:
            layout = self.context(plan).layout
            fixes = what_would_fit(
                plan, layout, self.dtype, have[0], checkpointing, one_unit=self.engine == "te", **options
            )
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
        """``plan`` as a model on this target, with no memory check of its own (the job or loader that
        calls it has checked everything it holds). ``seed``: seeds torch's generator first (the
        weights); ``engine``: another engine on the same device and dtype (``verify`` builds both);
        ``split=False``: the whole model even under a parallel layout (a teacher);
        ``activation_checkpointing``: ``train.activation_checkpointing``. The target's ``compile``
        applies to the reference engine."""
        if seed is not None:
            torch.manual_seed(seed)
        chosen = engine or self.engine
        parallel = self.parallel if split and self.is_parallel else None
        # A build allocates many small, acyclic module objects; the cyclic collector's full passes over
        # them made builds of 10k-op models grow quadratically (TE's own construction does the same).
        recipe = self.recipe if chosen == "te" and self.recipe is not NO_RECIPE else None
        with paused():
            model = assemble(
                plan,
                chosen,
                kernels=self.kernels,
                device=self.device,
                dtype=self.dtype,
                recipe=recipe,
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
        if local and self.parallel is not None and self.parallel.is_parallel:
            x, inputs = self.parallel.local_rows(x), self.parallel.local_inputs(inputs)
        return x, inputs

    def sync(self) -> None:
        """Wait for the device's queued work, so a timer reads finished work."""
        synchronize(self.device)


def as_target(target: Target | str) -> Target:
    """A target, or an engine name standing for ``Target.of(name)``; ``ArgumentError`` otherwise."""
    if isinstance(target, Target):
        return target
    if isinstance(target, str):
        return Target.of(target)
    raise ArgumentError(
        f"expected a te_assembly.Target or an engine name ('auto', 'reference', 'te'); got {target!r}"
    )


def for_source(target: Target | str, dtype: torch.dtype, recipe: Mapping[str, Any] | None = None) -> Target:
    """A loader's target for a saved model: an engine name loads it in its own ``dtype``; a ``Target``
    keeps its own. Either takes the source's ``recipe`` when it names none."""
    chosen = Target.of(target, dtype=dtype) if isinstance(target, str) else as_target(target)
    if chosen.recipe is NO_RECIPE and recipe is not None:
        chosen = dataclasses.replace(chosen, recipe=checked_recipe(recipe))
    return chosen


def synchronize(device: torch.device) -> None:
    """``torch.cuda.synchronize`` on a GPU; CPU work is synchronous already."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def assemble(
    plan: Plan,
    engine: str,
    *,
    kernels: str = "te",
    device: torch.device | None = None,
    dtype: torch.dtype = torch.float32,
    recipe: Recipe | None = None,
    parallel: ParallelContext | None = None,
) -> AssembledModel:
    """``plan`` built in ``engine`` (``Target.build`` calls it; no memory check, no seeding): the
    reference model, TE's fusers, or this rank's part of a parallel layout."""
    model = _assembled(plan, engine, kernels, device, dtype, recipe, parallel)
    if plan.adapter_params:
        freeze_base(model, plan, parallel)
    return model


def freeze_base(model: torch.nn.Module, plan: Plan, parallel: ParallelContext | None = None) -> None:
    """A plan with adapters trains only them: every other parameter stops requiring gradients, so no
    optimizer holds state for it and backward computes no weight gradient for it."""
    rename = parallel.local_to_global if parallel is not None else {}
    for name, param in model.named_parameters():
        param.requires_grad_(rename.get(name, name) in plan.adapter_params)


def _assembled(
    plan: Plan,
    engine: str,
    kernels: str,
    device: torch.device | None,
    dtype: torch.dtype,
    recipe: Recipe | None,
    parallel: ParallelContext | None,
) -> AssembledModel:
    device = device if device is not None else torch.device("cpu")
    if engine == "te" and not te_available():
        raise EngineUnavailableError(
            "engine=te needs Transformer Engine: pip install 'te_assembly[te]' "
            "(on a machine without a GPU: scripts/install_te_cpu.sh)"
        )
    if parallel is not None:
        from te_assembly.engines.parallel.build import build_parallel

        model = build_parallel(
            plan, parallel, engine, kernels=kernels, device=device, dtype=dtype, recipe=recipe
        )
        model.local_input_checks()  # a rank's inputs hold its own rows and expert groups
        return model
    if engine == "reference":
        from te_assembly.engines.reference.model import build_reference

        return build_reference(plan, device=device, dtype=dtype)
    from te_assembly.engines.te import build_te

    return build_te(plan, kernels=kernels, device=device, dtype=dtype, recipe=recipe)


__all__ = [
    "DTYPES",
    "NO_RECIPE",
    "Target",
    "as_target",
    "assemble",
    "for_source",
    "freeze_base",
    "resolve_device",
    "synchronize",
]
