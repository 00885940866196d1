"""What the hostile-input suite shares: the attacks, each a way to make a path that a surface is pointed
at, and a guard that turns a hang (a FIFO opened for reading waits for a writer forever) into a failure.

The suite is written against the shared mechanisms (``te_assembly.files``: the bounded reader, the path
sanitiser, the guarded directory writer): each class of attack is one parametrized test over every
surface that reads or writes through them, so a surface added later is covered by adding one row."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from tests.conftest import user_cli

HANG_LIMIT_S = 60


@pytest.fixture(autouse=True)
def no_hang() -> Iterator[None]:
    """A test of this suite that blocks (on a FIFO, a device) fails after ``HANG_LIMIT_S`` instead of
    stopping the suite."""

    def expired(signum: int, frame: object) -> None:
        raise TimeoutError(f"blocked for {HANG_LIMIT_S} s: a read that should have been refused")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(HANG_LIMIT_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


Attack = Callable[[Path], None]
"""Turns ``path`` (in a folder the surface reads) into the attack."""


def fifo(path: Path) -> None:
    os.mkfifo(path)


def device(path: Path) -> None:
    path.symlink_to("/dev/zero")


def unix_socket(path: Path) -> None:
    # Bound and left behind: a socket file on disk, as a daemon leaves one.
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.close()


def directory(path: Path) -> None:
    path.mkdir()


def symlink_out(path: Path) -> None:
    """A symlink to a file of the right kind outside the folder (an ordinary file, elsewhere)."""
    outside = path.parent.parent / f"outside-{path.name}"
    outside.write_text('{"secret": "from elsewhere"}\n')
    path.symlink_to(outside)


def symlink_sibling(path: Path) -> None:
    """A symlink into a sibling folder whose name starts with the folder's own (``given`` and
    ``given_evil/``): outside by path components, inside by a string prefix."""
    sibling = path.parent.parent / f"{path.parent.name}_evil"
    sibling.mkdir(exist_ok=True)
    (sibling / path.name).write_text('{"secret": "from elsewhere"}\n')
    path.symlink_to(sibling / path.name)


def huge(path: Path) -> None:
    """A sparse file larger than any limit (takes no disk)."""
    with open(path, "wb") as f:
        f.truncate(64 * 2**30)


def not_utf8(path: Path) -> None:
    path.write_bytes(b'{"a": "\xff\xfe"}\n')


def deep_json(path: Path) -> None:
    path.write_text("[" * 200_000 + "]" * 200_000)


TYPE_ATTACKS: dict[str, Attack] = {
    "fifo": fifo,
    "device": device,
    "socket": unix_socket,
    "directory": directory,
}
"""Paths that are no regular file: refused by type, before any open."""

READ_ATTACKS: dict[str, Attack] = {
    **TYPE_ATTACKS,
    "symlink-out": symlink_out,
    "symlink-sibling": symlink_sibling,
    "too-large": huge,
}
"""Every attack on the bounded reader that does not depend on the file's format."""


def clean_failure(done: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    """``done`` ended with ``code``, one clean message (no traceback, nothing 'unexpected') holding
    ``words``."""
    text = done.stdout + done.stderr
    assert done.returncode == code, text
    assert "Traceback" not in text and "unexpected" not in text, text
    for word in words:
        assert word in text, (word, text)


def tree(root: Path) -> dict[str, bytes]:
    """Every file below ``root`` and its content (links as their target), to compare before and after."""
    out: dict[str, bytes] = {}
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            out[str(path.relative_to(root))] = os.readlink(path).encode()
        elif path.is_file():
            with contextlib.suppress(OSError):
                out[str(path.relative_to(root))] = path.read_bytes()
    return out


__all__: Sequence[str] = [
    "READ_ATTACKS",
    "TYPE_ATTACKS",
    "clean_failure",
    "tree",
    "user_cli",
]


@pytest.fixture(scope="session")
def hf_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama checkpoint made by ``transformers`` (once per session)."""
    from tests.hf.tiny import make

    return make("llama", tmp_path_factory.mktemp("hostile-hf") / "llama")
