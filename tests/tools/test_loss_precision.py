"""run, train and bench compute their loss in one precision: float32 at least, float64 kept as is."""

from __future__ import annotations

import pytest
import torch

from te_assembly.engines.base import ModelOutput
from te_assembly.jobs.bench.runner import bench_loss
from te_assembly.jobs.run import loss_of
from te_assembly.jobs.train.task import loss_terms

CASES = [(torch.bfloat16, torch.float32), (torch.float32, torch.float32), (torch.float64, torch.float64)]


@pytest.mark.parametrize(("dtype", "expected"), CASES)
def test_every_loss_is_computed_in_the_same_precision(dtype: torch.dtype, expected: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    y = torch.randn(8, 4, generator=gen).to(dtype)
    target = torch.randn(8, 4, generator=gen).to(dtype)
    extras = {
        "balance": torch.rand((), generator=gen).to(dtype),
        "tap": torch.randn(8, 4, generator=gen).to(dtype),
    }
    names = ("balance",)

    run_loss = loss_of(y, extras, names)
    train_terms = loss_terms(y, target, extras, names)
    bench = bench_loss(ModelOutput(y, extras), names)

    assert run_loss.dtype == expected
    assert {k: t.dtype for k, t in train_terms.items()} == {"mse(y, teacher)": expected, "balance": expected}
    assert bench.dtype == expected


def test_float64_loss_keeps_float64_resolution() -> None:
    # A difference of 1e-12 is below float32's resolution near 1: narrowing would make the error 0.
    y = torch.full((4, 2), 1.0 + 1e-12, dtype=torch.float64)
    target = torch.ones(4, 2, dtype=torch.float64)
    mse = loss_terms(y, target, {}, ())["mse(y, teacher)"]
    assert mse.item() == pytest.approx(1e-24, rel=1e-3, abs=0)
    assert bench_loss(ModelOutput(y - 1.0, {}), ()).item() == pytest.approx(1e-24, rel=1e-3, abs=0)
