"""The config pipeline's first two passes: files read once (``source``), Hydra composition with the model
and recipe kept out of OmegaConf (``composition``), overrides and interpolations applied to plain data
(``overrides``, ``interpolate``) into a ``ResolvedConfig`` (``resolved``). ``locations`` says where
configs live. ``te_assembly.load`` (``analysis/pipeline.py``) runs it all.
"""

from __future__ import annotations

from te_assembly.config.locations import (
    FILE_GROUPS,
    available_models,
    available_recipes,
    configs_dir,
    recipes_dir,
    shipped_config,
)

__all__ = [
    "FILE_GROUPS",
    "available_models",
    "available_recipes",
    "configs_dir",
    "recipes_dir",
    "shipped_config",
]
