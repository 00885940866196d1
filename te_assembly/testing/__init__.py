"""Config-level validation tests for your own configs: ``assert_valid``, ``assert_diagnostics`` and
``assert_recipe`` for tests you write, and a pytest plugin (``plugin.py``, registered as ``pytest11``)
that turns a config folder into test items (``pytest --te-configs DIR``). Failures are
``ConfigCheckError`` (an ``AssertionError``) whose message is te_assembly's diagnostics. Expected
diagnostics live beside a config in ``NAME.expect.yaml`` (``expect.py``)."""

from __future__ import annotations

from te_assembly.errors import ConfigCheckError, SidecarError
from te_assembly.testing.checks import assert_diagnostics, assert_recipe, assert_valid
from te_assembly.testing.expect import Expected, read_sidecar

__all__ = [
    "ConfigCheckError",
    "Expected",
    "SidecarError",
    "assert_diagnostics",
    "assert_recipe",
    "assert_valid",
    "read_sidecar",
]
