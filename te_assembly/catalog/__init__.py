"""The op catalog: every op and module a config may name, declared once.

The validator, both engines, ``explain``, ``graph`` and the docs all read these entries.
"""

from __future__ import annotations

import importlib
from typing import Any

from te_assembly.catalog.adapter_ops import ADAPTER_OPS, ADAPTER_TYPES
from te_assembly.catalog.branch_ops import BRANCH_OPS
from te_assembly.catalog.capping_ops import CAPPING_OPS
from te_assembly.catalog.modules import MODULES
from te_assembly.catalog.moe_ops import MOE_OPS
from te_assembly.catalog.prediction_ops import PREDICTION_OPS
from te_assembly.catalog.spec import (
    INPUT_LAYOUTS,
    LAYOUTS,
    REQUIRED,
    SEQUENCE_LAYOUTS,
    Formula,
    ModuleSpec,
    MultipleOf,
    OpSpec,
    Param,
    Slot,
    Width,
)
from te_assembly.catalog.te_ops import TE_OPS
from te_assembly.catalog.token_ops import TOKEN_OPS

OPS: dict[str, OpSpec] = {
    spec.name: spec
    for spec in (*TE_OPS, *MOE_OPS, *TOKEN_OPS, *BRANCH_OPS, *ADAPTER_OPS, *CAPPING_OPS, *PREDICTION_OPS)
}
MODULE_ALLOWLIST: dict[str, ModuleSpec] = {spec.name: spec for spec in MODULES}


def load_object(path: str) -> Any:
    """Import ``module:attr``. Only called with paths from this catalog, never from a config."""
    module_name, _, attr = path.partition(":")
    return getattr(importlib.import_module(module_name), attr)


__all__ = [
    "ADAPTER_TYPES",
    "INPUT_LAYOUTS",
    "LAYOUTS",
    "MODULE_ALLOWLIST",
    "OPS",
    "REQUIRED",
    "SEQUENCE_LAYOUTS",
    "Formula",
    "ModuleSpec",
    "MultipleOf",
    "OpSpec",
    "Param",
    "Slot",
    "Width",
    "load_object",
]
