"""A stop that a signal asks for waits for the end of the training step it arrives in.

A signal handler that raises runs between any two bytecodes, so its exception can land inside a
safetensors write or a torch call that reports a Python callback's failure as an error of its own (seen
in CI: ``ValueError: could not determine the shape of object type 'torch.storage.UntypedStorage'``
instead of the stop). Inside ``at_step_ends`` the handler only records the stop, and the loop raises it
where a step (its checkpoint included) has ended; a second signal stops at once, for a step that hangs.
Outside, the stop is raised at once.

``signals_stop`` routes SIGTERM and SIGINT here for the duration of a run."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

from te_assembly.errors import Terminated


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
    """SIGTERM stops training as Ctrl-C does (the run says what it kept), instead of killing it
    mid-line; both wait for the end of the step they arrive in (``at_step_ends``), a second one stops
    at once. The previous handlers come back after. Not under torchrun: its agent ends the other ranks
    with SIGTERM when one fails, and a rank waiting in a collective must die then, not wait for it; nor
    off the main thread, where Python takes no handlers."""
    from te_assembly.analysis.parallel.launch import current_launch

    if threading.current_thread() is not threading.main_thread() or current_launch().under_torchrun:
        yield
        return

    stops: dict[int, type[KeyboardInterrupt]] = {signal.SIGTERM: Terminated, signal.SIGINT: KeyboardInterrupt}

    def handler(signum: int, frame: Any) -> None:
        ask(stops[signum]())

    # A signal the parent set to be ignored (nohup, a shell's background job for SIGINT) stays ignored.
    previous = {s: signal.signal(s, handler) for s in stops if signal.getsignal(s) is not signal.SIG_IGN}
    try:
        yield
    finally:
        for s, was in previous.items():
            signal.signal(s, was)
