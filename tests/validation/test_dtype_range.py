"""Values finite in float64 but not in the model's dtype are config errors: ``train.lr=1e300`` on a
float32 model would make the first update infinite."""

from __future__ import annotations

import pytest

from te_assembly.analysis.analyze import DEFAULT_SECTIONS
from te_assembly.analysis.pipeline import load
from te_assembly.jobs.bench.settings import BenchSettings
from te_assembly.jobs.train.settings import TrainSettings

SECTIONS = {**DEFAULT_SECTIONS, "train": TrainSettings, "bench": BenchSettings}


@pytest.mark.parametrize(
    ("override", "dtype", "refused"),
    [
        ("train.lr=1e300", "float32", True),
        ("train.lr=1e300", "bfloat16", True),
        ("train.lr=1e300", "float64", False),
        ("train.weight_decay=1e39", "float32", True),
        ("bench.lr=1e39", "float32", True),
        ("train.lr=3e38", "float32", False),
    ],
)
def test_a_setting_beyond_the_dtypes_range_is_refused(override: str, dtype: str, refused: bool) -> None:
    found = [
        d
        for d in load("residual_mlp", [override, f"dtype={dtype}"], sections=SECTIONS).diagnostics
        if d.is_error
    ]
    key = override.split("=")[0]
    assert [(d.code, d.path) for d in found] == ([("out-of-range", key)] if refused else [])
    if refused:
        assert f"is not a finite number in {dtype}" in found[0].message
