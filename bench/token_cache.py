"""What the token cache's content check costs: every time an entry is opened (a fresh run, a resume,
``eval``) each of its files is hashed in full (SHA-256) and ``meta.json`` checked against its own
digest. Side by side in one run: tokenizing a corpus into the cache, then opening the entry again
(the check and the memory maps), as seconds, MiB of ids per second, and the ratio of the two.

    python bench/token_cache.py                 # 64 MiB of text, byte-level ids (128 MiB of uint16)
    python bench/token_cache.py --mib 256 --opens 5
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=64, help="MiB of text in the corpus")
    parser.add_argument("--opens", type=int, default=3, help="times the entry is opened again")
    args = parser.parse_args()

    from te_assembly.data.cache import prepare
    from te_assembly.data.settings import DataSettings

    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus"
        corpus.mkdir()
        line = "The quick brown fox jumps over the lazy dog, and the token cache checks every byte.\n"
        per_file = max(1, args.mib // 8)
        for n in range(8):
            (corpus / f"part{n}.txt").write_text(line * (per_file * 2**20 // len(line)))
        settings = DataSettings(path=str(corpus), cache_dir=str(Path(tmp) / "cache"))
        began = time.perf_counter()
        built = prepare(settings)
        tokenize = time.perf_counter() - began
        assert built.directory is not None
        ids_mib = sum(p.stat().st_size for p in built.directory.glob("*.bin")) / 2**20
        del built
        opens = []
        for _ in range(args.opens):
            began = time.perf_counter()
            again = prepare(settings)
            opens.append(time.perf_counter() - began)
            del again
    opened = statistics.median(opens)
    print(f"corpus: {args.mib} MiB of text -> {ids_mib:.0f} MiB of ids")
    print(f"tokenize into the cache: {tokenize:.2f} s")
    print(
        f"open the entry (every file hashed, meta.json checked): {opened:.2f} s, {ids_mib / opened:.0f} MiB/s"
    )
    print(f"open / tokenize = {opened / tokenize:.3f}")


if __name__ == "__main__":
    main()
