"""Typed exceptions. Library code raises these; only the CLI turns them into exit codes."""

from __future__ import annotations

from collections.abc import Sequence

from te_assembly.diagnostics import Diagnostic


class TeAssemblyError(Exception):
    """Base class of every error te_assembly raises on purpose."""


def first_line(exc: BaseException) -> str:
    """What another library's exception says, in one line: its message's first line, or its type's
    name when it says nothing (torch's and gloo's errors run over many lines)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class ConfigError(TeAssemblyError):
    """A config failed validation; ``diagnostics`` holds every finding, errors and warnings."""

    def __init__(self, diagnostics: Sequence[Diagnostic], summary: str | None = None) -> None:
        self.diagnostics = list(diagnostics)
        errors = [d for d in self.diagnostics if d.is_error]
        text = summary or f"{len(errors)} config error(s)"
        if errors:
            text += ":\n" + "\n".join("  " + d.format() for d in errors)
        super().__init__(text)


class CompositionError(TeAssemblyError):
    """Hydra could not compose the config (unknown model name, bad override...)."""


class EngineUnavailableError(TeAssemblyError):
    """The requested engine cannot run here (TE not installed, no GPU for TE kernels...)."""


class UnsupportedRecipeError(TeAssemblyError):
    """The quantization recipe needs hardware this machine does not have."""


class NonFiniteError(TeAssemblyError):
    """A loss or gradient became NaN/Inf during training."""

    def __init__(self, step: int, tensor: str, message: str | None = None) -> None:
        self.step = step
        self.tensor = tensor
        super().__init__(message or f"non-finite value in {tensor} at step {step}")


class VerificationError(TeAssemblyError):
    """Two engines disagreed beyond tolerance."""


class OutputPathError(TeAssemblyError):
    """A directory that results go to cannot be created or written (``cannot write to ...``)."""


class ParallelError(TeAssemblyError):
    """A parallel (torchrun) run failed on this rank: a collective, or an injected failure."""


class CollectiveError(ParallelError):
    """A collective failed: another rank stopped, hung past ``parallel.timeout_s``, or the network broke."""


class InjectedFailure(ParallelError):
    """``parallel.fail_on_rank``: this rank was told to fail (a test of the job's failure handling)."""


class ArgumentError(TeAssemblyError, TypeError, ValueError):
    """A library function was given an argument of the wrong type or value (``build(None)``, an integer
    dtype, an unknown device...). Both a ``TypeError`` and a ``ValueError``, as callers may expect either."""


class ChoiceError(ConfigError, ArgumentError):
    """An engine or kernels value no target can have (``Target.of("tee")``): a config error with its
    diagnostic, and an ``ArgumentError`` (a ``TypeError`` and ``ValueError``), as a target's values come
    from a config or from Python alike."""


class ResourceError(TeAssemblyError):
    """The work cannot fit this machine: the memory it needs (estimated from the plan before anything is
    allocated) is more than is available."""


class RunDirectoryInUseError(TeAssemblyError):
    """Another process holds the lock of a run directory (``train.out_dir``): two runs never share one."""


class MissingToolError(TeAssemblyError):
    """A program or optional package the work needs is not installed (Graphviz's ``dot`` for SVG/PNG,
    ``tensorboard`` when asked for); the message says how to get it."""


class CheckpointError(TeAssemblyError):
    """A checkpoint cannot be read or written, is corrupt, or does not fit the model being resumed."""


class ExistingRunError(CheckpointError):
    """``out_dir`` holds checkpoints, and neither ``resume`` nor ``overwrite`` says what to do with them."""


class SplitError(TeAssemblyError):
    """The plan cannot be cut where asked."""


class CallError(TeAssemblyError, TypeError):
    """A model was called with missing, unknown or surplus public inputs, or tensors that do not fit."""


class InputShapeError(CallError, ValueError):
    """``x`` or a public input has a shape, dtype kind or device the plan does not allow."""


class InterpolationError(Exception):
    """One leaf of a config could not be resolved; the message is the diagnostic's. Internal to the
    config pipeline, which turns it into a diagnostic (so not a ``TeAssemblyError``)."""

    def __init__(self, message: str, hint: str | None = None, *, long_chain: bool = False) -> None:
        super().__init__(message)
        self.hint = hint
        self.long_chain = long_chain
        """Refused for the length of its chain of references: every value further along fails alike."""


class SidecarError(TeAssemblyError, ValueError):
    """A config's ``.expect.yaml`` sidecar (``te_assembly.testing``) cannot be read as one; the message
    names the file and the key."""


class ConfigCheckError(TeAssemblyError, AssertionError):
    """A config check (``te_assembly.testing``: ``assert_valid``, ``assert_diagnostics``, the pytest
    plugin's items) found what it must not, or missed what it must; the message is te_assembly's own
    diagnostics, ready to show as the test's failure."""


class OverrideRefused(Exception):
    """An override that cannot apply to a model or recipe file (a sweep in a single run, a key that is
    not there, an index out of range). Internal to the config layer, which turns it into a diagnostic at
    ``path`` (so not a ``TeAssemblyError``)."""

    def __init__(self, message: str, path: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.hint = hint


class Terminated(KeyboardInterrupt):
    """SIGTERM during a command that turns it into an orderly stop (``train``): handled like Ctrl-C,
    reported with exit code 143 (128 + SIGTERM), as the shell reports a process SIGTERM ended."""


class TemplateError(TeAssemblyError):
    """A Jinja template (a checkpoint's chat template) that cannot be rendered: its own error, a bound
    of the renderer (time, size, numbers, recursion) or the sandbox's refusal (``files/template.py``)."""


class DataError(TeAssemblyError):
    """A language model's data cannot be read or does not fit the model: a missing or empty source, a
    binary or non-UTF-8 file, a token id beyond the vocabulary, a corpus shorter than one sequence."""
