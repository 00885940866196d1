"""A stop that a signal asks for waits for the end of the training step it arrives in.

A signal handler that raises runs between any two bytecodes, so its exception can land inside a
safetensors write or a torch call that reports a Python callback's failure as an error of its own (seen
in CI: ``ValueError: could not determine the shape of object type 'torch.storage.UntypedStorage'``
instead of the stop). Inside ``at_step_ends`` the handler only records the stop, and the loop raises it
where a step (its checkpoint included) has ended; a second signal stops at once, for a step that hangs.
Outside, the stop is raised at once.

``signals_stop`` routes SIGTERM and SIGINT here for the duration of a run, under torchrun too: what a
scheduler sends a job it preempts (Slurm, Kubernetes, spot instances) reaches every rank, each at its own
instant, so the ranks agree at each step's start whether any was asked (``agreed_stop``: one small
all-reduce), then all write one checkpoint of the step they ended and exit 143, the code that
schedulers and Kubeflow's ``ExitCode`` policy retry. A rank that a signal finds blocked in a collective
(torchrun stops the others so when one fails) exits by itself after ``STOP_GRACE_S``."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from te_assembly.errors import Terminated

if TYPE_CHECKING:
    from te_assembly.engines.parallel.context import ParallelContext

STOP_GRACE_S = 25.0
"""Under torchrun, how long a rank asked to stop may take to end its step and write the checkpoint
before it exits regardless: torchrun's agent kills its workers 30 s after passing a SIGTERM on."""


class _Requests:
    deferring = False
    pending: BaseException | None = None


_state = _Requests()


def ask(stop: BaseException) -> None:
    """From a signal handler: raise ``stop`` now, or record it while a step runs (once)."""
    if _state.deferring and _state.pending is None:
        _state.pending = stop
        return
    _state.pending = None
    raise stop


def stop_if_asked() -> None:
    """Between steps: raise the stop a signal asked for during the step, if one did."""
    pending, _state.pending = _state.pending, None
    if pending is not None:
        raise pending


def agreed_stop(par: ParallelContext | None) -> BaseException | None:
    """At a step's start: the stop a signal asked for before it, on every rank when any rank was asked
    (a rank that stopped alone would leave the others waiting in the step's collectives)."""
    pending, _state.pending = _state.pending, None
    if par is not None and not par.all_agree(pending is None):
        return pending if pending is not None else Terminated()
    return pending


@contextlib.contextmanager
def at_step_ends() -> Iterator[None]:
    """Signals that arrive inside wait for ``stop_if_asked`` (or the end of the block)."""
    _state.deferring, _state.pending = True, None
    try:
        yield
    except BaseException:
        _state.pending = None  # the block ends with an error of its own: that one is reported
        raise
    finally:
        _state.deferring = False
    stop_if_asked()


@contextlib.contextmanager
def signals_stop() -> Iterator[None]:
    """SIGTERM stops training as Ctrl-C does (the run writes a checkpoint of the step it ended and says
    what it kept), instead of killing it mid-line; both wait for the end of the step they arrive in
    (``at_step_ends``), a second one stops at once. Under torchrun a second one changes nothing (a
    scheduler signals torchrun's agent and its workers alike, and the agent passes its signal on), and
    a rank whose step does not end within ``STOP_GRACE_S`` of the first exits (module docstring). The
    previous handlers come back after. Not off the main thread, where Python takes no handlers."""
    from te_assembly.analysis.parallel.launch import current_launch

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    launch = current_launch()
    stops: dict[int, type[KeyboardInterrupt]] = {signal.SIGTERM: Terminated, signal.SIGINT: KeyboardInterrupt}

    def handler(signum: int, frame: Any) -> None:
        if launch.under_torchrun:
            if _state.pending is not None:
                return  # the scheduler's signal, then torchrun's agent passing it on: one stop
            _exit_after(STOP_GRACE_S, f"{launch.tag}stop asked for ({signal.Signals(signum).name})")
        ask(stops[signum]())

    # A signal the parent set to be ignored (nohup, a shell's background job for SIGINT) stays ignored.
    previous = {s: signal.signal(s, handler) for s in stops if signal.getsignal(s) is not signal.SIG_IGN}
    try:
        yield
    finally:
        for s, was in previous.items():
            signal.signal(s, was)


def _exit_after(seconds: float, why: str) -> None:
    """Exit this process with 143 in ``seconds`` unless it has ended by then (a daemon timer)."""

    def exit_now() -> None:
        print(
            f"{why}: the step did not end within {seconds:g} s (a collective waits on a rank that is "
            "gone); exiting",
            file=sys.stderr,
            flush=True,
        )
        os._exit(143)

    timer = threading.Timer(seconds, exit_now)
    timer.daemon = True
    timer.start()
