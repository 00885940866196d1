"""Config-level validation: every finding at once, before any tensor or TE import.

The passes live one per file (``steps``, ``fusers``, ``widths``, ``channels``, ``recipe_shapes``) and
``analysis`` runs them; ``te_assembly.load`` (``pipeline.py``) is the way in. Pure Python: this package
imports neither torch nor transformer_engine.
"""

from __future__ import annotations

from te_assembly.analysis.analyze import Analysis, ModelAnalysis, analyze_model, analyze_resolved

__all__ = ["Analysis", "ModelAnalysis", "analyze_model", "analyze_resolved"]
