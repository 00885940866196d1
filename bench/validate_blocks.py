"""``validate`` of a model built from blocks against the same ops written out flat.

    python bench/validate_blocks.py [--layers 96] [--repeats 5]

A user folder DIR (a temp directory) gets the shipped ``moe_layer`` block, a model ``blocks_N`` that
repeats it N times (the shipped ``moe_transformer`` with ``layers: N``), and ``flat_N``: the same model
with every block step expanded and written out as plain YAML (the steps ``layers.3.router`` ... with
their channels, generated from the plan of ``blocks_N``, so both are the same ops). Measured in one run:

1. CLI: ``python -m te_assembly validate -cd DIR model=...`` in a fresh process, wall time. Goal: the
   96-layer ``moe_transformer`` (about 1,600 expanded steps) under 2 s on the 2-core CPU machine kind.
2. Library: ``te_assembly.load(...)`` from YAML on disk to a plan, in this process.

and the ratio blocks / flat of each. Times are the best of ``--repeats`` runs.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

# Run from a checkout without installing: the package sits next to bench/.
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import te_assembly  # noqa: E402
from te_assembly.jobs.bench.split import plan_to_model  # noqa: E402

GOAL_S = 2.0
"""CLI validate wall-time goal for the 96-layer moe_transformer (issue 10)."""


def best_time(fn: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        gc.collect()
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def cli_seconds(folder: Path, name: str, repeats: int) -> tuple[float, int, str]:
    """Wall time of ``validate`` in a fresh process, run from the user's folder."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    command = [sys.executable, "-m", "te_assembly", "validate", "-cd", str(folder), f"model={name}"]
    result: dict[str, object] = {}

    def run() -> None:
        done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, check=False)
        result["code"], result["out"] = done.returncode, done.stdout + done.stderr

    seconds = best_time(run, repeats)
    return seconds, int(str(result["code"])), str(result["out"])


def fresh_load(name: str, folder: Path) -> None:
    """``te_assembly.load`` with the YAML read and parsed again (the pipeline keeps the last few parsed
    files by path and mtime, which would leave the flat model's parse out of the timing)."""
    from te_assembly.config import source

    source._CACHE.clear()
    te_assembly.load(name, config_dirs=[folder])


def write_models(folder: Path, layers: int) -> tuple[str, str, int]:
    """(blocks model name, flat model name, expanded steps)."""
    (folder / "block").mkdir()
    (folder / "model").mkdir()
    shutil.copy(te_assembly.shipped_config("block/moe_layer.yaml"), folder / "block" / "moe_layer.yaml")
    blocks = yaml.safe_load(te_assembly.shipped_config("model/moe_transformer.yaml").read_text())
    blocks["name"] = f"blocks_{layers}"
    blocks["dims"]["layers"] = layers
    (folder / "model" / f"blocks_{layers}.yaml").write_text(yaml.safe_dump(blocks, sort_keys=False))
    plan = te_assembly.load(f"blocks_{layers}", config_dirs=[folder]).checked_plan()
    flat = plan_to_model(plan)
    flat["name"] = f"flat_{layers}"
    (folder / "model" / f"flat_{layers}.yaml").write_text(yaml.safe_dump(flat, sort_keys=False))
    return str(blocks["name"]), str(flat["name"]), len(plan.steps)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--layers", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    console = Console(highlight=False, width=160)
    console.print(
        f"Python {platform.python_version()}; {os.cpu_count()} logical cores; load average "
        f"{os.getloadavg()[0]:.2f} (other work on the machine skews the numbers); best of {args.repeats}",
        markup=False,
    )
    with tempfile.TemporaryDirectory(prefix="te_assembly-user-") as tmp:
        folder = Path(tmp)
        blocks, flat, steps = write_models(folder, args.layers)
        table = Table(title=f"validate: moe_transformer with {args.layers} layers ({steps:,} steps)")
        for col in ("model", "CLI s", "library load s", "CLI ratio", "library ratio"):
            table.add_column(col, justify="left" if col == "model" else "right")
        rows = []
        for name in (blocks, flat):
            cli_s, code, out = cli_seconds(folder, name, args.repeats)
            if code != 0:
                console.print(f"validate {name} failed (exit {code}):\n{out}", markup=False)
                return 1
            lib_s = best_time(lambda n=name: fresh_load(n, folder), args.repeats)  # type: ignore[misc]
            rows.append((name, cli_s, lib_s))
        base_cli, base_lib = rows[1][1], rows[1][2]
        for name, cli_s, lib_s in rows:
            kind = "blocks (repeat)" if name == blocks else "flat (written out)"
            table.add_row(
                f"{name}: {kind}",
                f"{cli_s:.2f}",
                f"{lib_s:.4f}",
                f"{cli_s / base_cli:.2f}",
                f"{lib_s / base_lib:.2f}",
            )
        console.print(table)
        verdict = "met" if rows[0][1] < GOAL_S else "MISSED"
        console.print(f"goal: CLI validate of the blocks model under {GOAL_S:g} s: {verdict}", markup=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
