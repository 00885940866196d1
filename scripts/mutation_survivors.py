"""List the surviving mutants of the last ``mutmut run`` as Markdown, one line per mutant with the line it
changed, grouped by function: the starting point for triage in docs/mutation-survivors.md.

Run from the repository root after a ``mutmut run``; ``scripts/mutation.sh`` calls it.
Uses mutmut's own readers (pinned to mutmut 3 in the ``[mutation]`` extra).
"""

from __future__ import annotations

import sys
from collections import defaultdict

from mutmut.mutation.data import SourceFileMutationData
from mutmut.mutation.diff_apply import get_diff_for_mutant
from mutmut.stats import status_by_exit_code
from mutmut.utils.file_utils import walk_mutatable_files


def changed_lines(diff: str) -> str:
    """The removed and added lines of a unified diff, each stripped, as ``old`` -> ``new``."""
    lines = diff.splitlines()
    old = [line[1:].strip() for line in lines if line.startswith("-") and not line.startswith("---")]
    new = [line[1:].strip() for line in lines if line.startswith("+") and not line.startswith("+++")]
    return f"`{' / '.join(old)}` -> `{' / '.join(new)}`"


def main() -> int:
    by_function: dict[str, list[str]] = defaultdict(list)
    for path in walk_mutatable_files():
        data = SourceFileMutationData(path=path)
        data.load()
        for name, code in data.exit_code_by_key.items():
            if status_by_exit_code[code] != "survived":
                continue
            function = name.rsplit("__mutmut_", 1)[0]
            by_function[function].append(f"- `{name}`: {changed_lines(get_diff_for_mutant(name, path=path))}")
    total = sum(len(v) for v in by_function.values())
    print(f"# {total} surviving mutant(s)\n")
    for function in sorted(by_function):
        print(f"## {function}\n")
        print("\n".join(by_function[function]), end="\n\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
