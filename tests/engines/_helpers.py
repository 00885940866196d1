"""Helpers for the engine tests: build a model from inline YAML with the reference engine."""

from __future__ import annotations

import textwrap

import torch

from te_assembly.analysis import analyze_resolved
from te_assembly.analysis.plan import Plan
from te_assembly.config.resolved import resolve_text
from te_assembly.engines import build
from te_assembly.engines.reference.model import ReferenceModel
from te_assembly.engines.target import Target

F64 = torch.float64


def plan_from_yaml(text: str) -> Plan:
    resolved = resolve_text(textwrap.dedent(text))
    assert not resolved.diagnostics, [d.format() for d in resolved.diagnostics]
    return analyze_resolved(resolved).checked_plan()


def build_yaml(text: str, dtype: torch.dtype = F64, seed: int = 0) -> ReferenceModel:
    torch.manual_seed(seed)
    model = build(plan_from_yaml(text), Target.of("reference", dtype=dtype))
    assert isinstance(model, ReferenceModel)
    return model


def randomize(model: torch.nn.Module, seed: int = 1, scale: float = 0.5) -> None:
    """Overwrite every parameter with random values: zero-initialised biases would hide bias bugs."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * scale)
