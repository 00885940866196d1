"""Plant one bug by hand and see whether a test notices: the habit after a change to numerics, masks,
readers or writers (docs/contributing.md).

    python scripts/plant_bug.py FILE OLD NEW [-- PYTEST ARGS...]

replaces the one occurrence of OLD in FILE with NEW, runs pytest (with PYTEST ARGS, in the current
folder), and puts FILE back as it was, whatever happens (a failure, Ctrl-C, a kill by SIGTERM). It prints
``caught`` and exits 0 when some test failed, ``SURVIVED`` and exits 1 when every test passed (the bug
needs a test), and exits 2 when OLD is not in FILE exactly once or pytest collected nothing.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path

NO_TESTS = 5
"""pytest's exit status when it collected no test."""


def _arguments(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    cut = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", type=Path, help="the source file to plant the bug in")
    parser.add_argument("old", help="the text to replace: it must occur exactly once")
    parser.add_argument("new", help="what to put in its place")
    return parser.parse_args(argv[:cut]), argv[cut + 1 :]


def main(argv: list[str]) -> int:
    args, pytest_args = _arguments(argv)
    original = args.file.read_bytes()
    text = original.decode("utf-8")
    if text.count(args.old) != 1:
        print(
            f"{args.file}: the text to replace occurs {text.count(args.old)} times, not once", file=sys.stderr
        )
        return 2

    def restore(*_: object) -> None:
        args.file.write_bytes(original)

    def stop(signum: int, frame: object) -> None:
        restore()
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        args.file.write_text(text.replace(args.old, args.new), encoding="utf-8")
        # Bytecode compiled from the planted file must not outlive it.
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *pytest_args], env=env
        )
    finally:
        restore()
        signal.signal(signal.SIGTERM, previous)
    if done.returncode == NO_TESTS:
        print("no test ran: nothing was checked", file=sys.stderr)
        return 2
    if done.returncode == 0:
        print(f"SURVIVED: every test passed with the bug planted in {args.file}")
        return 1
    print(f"caught: a test failed with the bug planted in {args.file}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
