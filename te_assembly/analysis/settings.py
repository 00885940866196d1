"""The settings every command shares: the top-level keys (engine, kernels, device, dtype, seed) and the
``run:`` section. Dataclasses are the schema (``sections.setting``); ``configs/config.yaml`` holds the
same defaults with comments. Pure Python: the torch objects these names stand for are made by the
jobs that need them (``engines/target.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from te_assembly.fields import INT64_MAX
from te_assembly.sections import setting

ENGINES = ("auto", "reference", "te")
KERNELS = ("te", "reference")
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("float32", "float64", "bfloat16")


@dataclass(frozen=True)
class CommonSettings:
    """Top-level keys: how and where every command builds and runs the model."""

    engine: str = setting(
        "auto", choices=ENGINES, doc="auto: te when Transformer Engine imports and a CUDA GPU is present"
    )
    kernels: str = setting(
        "te", choices=KERNELS, doc="with engine=te: TE's kernels, or our reference math inside TE's fusers"
    )
    device: str = setting(
        "auto",
        choices=DEVICES,
        pattern=r"cuda:\d+",
        pattern_doc="cuda:N",
        doc="auto: cuda when a GPU is visible, else cpu",
    )
    dtype: str = setting("float32", choices=DTYPES, doc="parameter and activation dtype")
    seed: int = setting(0, minimum=0, maximum=INT64_MAX, doc="seeds weights and synthetic data")
    hf: str | None = setting(
        None,
        nonempty=True,
        doc="verify: a Hugging Face checkpoint directory, its te_assembly import compared with transformers",
    )
    compile: bool = setting(
        False,
        doc="reference engine: torch.compile each block use (a model without blocks: the whole forward); "
        "the first call compiles, then each call runs the compiled code",
    )


@dataclass(frozen=True)
class RunSettings:
    """``run:``: the main job, a few forward+backward steps on synthetic data."""

    steps: int = setting(3, minimum=1, doc="forward+backward steps")
    tokens: int = setting(256, minimum=1, doc="rows of x per step")
    seq_len: int = setting(
        32, minimum=1, doc="positions per sequence when the model takes x as [batch, seq, features]"
    )


COMMON_KEYS = tuple(CommonSettings.__dataclass_fields__)
"""The top-level settings keys, in declaration order."""

__all__ = ["COMMON_KEYS", "DEVICES", "DTYPES", "ENGINES", "KERNELS", "CommonSettings", "RunSettings"]
