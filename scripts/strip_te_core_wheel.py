"""Copy TE's core wheel (transformer-engine-cu13) without libtransformer_engine.so (343 MB).

The GPU bundle ships that library separately, slimmed to one architecture and xz-compressed; the rest
of the wheel is still needed there: its dist-info (TE's import asserts the core package is installed
from a wheel, at the same version) and the headers the PyTorch extension compiles against.
Usage: python strip_te_core_wheel.py CORE_WHEEL OUT_DIR
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

LIBRARY = "transformer_engine/wheel_lib/libtransformer_engine.so"


def strip(wheel: Path, out_dir: Path) -> Path:
    out = out_dir / wheel.name
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            if info.filename == LIBRARY:
                continue
            data = src.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines(keepends=True)
                data = "".join(line for line in lines if not line.startswith(LIBRARY + ",")).encode()
            dst.writestr(info, data)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    print(strip(Path(sys.argv[1]), Path(sys.argv[2])))
