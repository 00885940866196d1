"""The Hugging Face families te_assembly imports and exports: one file each, one line each here.

Adding a family is its file (a ``Family`` assembled from an attention and an MLP part, with what is its
own), its block YAMLs (``configs/block/``) and its line in ``REGISTRY``. Nothing outside this package
branches on a family.
"""

from __future__ import annotations

from te_assembly.formats.hf.families.base import Family
from te_assembly.formats.hf.families.deepseek_v3 import DeepseekV3
from te_assembly.formats.hf.families.fields import (
    CHECKED,
    COMMON_FIELDS,
    GENERATION_DEFAULTS,
    KEPT_FIELDS,
    METADATA_FIELDS,
    METADATA_PATTERNS,
    REMOTE_CODE_FIELDS,
    is_metadata,
)
from te_assembly.formats.hf.families.gemma2 import Gemma2
from te_assembly.formats.hf.families.gemma3 import Gemma3
from te_assembly.formats.hf.families.glm4_moe import Glm4Moe
from te_assembly.formats.hf.families.gpt_oss import GptOss
from te_assembly.formats.hf.families.llama import Llama
from te_assembly.formats.hf.families.mistral import Mistral
from te_assembly.formats.hf.families.mixtral import Mixtral
from te_assembly.formats.hf.families.olmo2 import Olmo2
from te_assembly.formats.hf.families.phi3 import Phi3
from te_assembly.formats.hf.families.qwen2 import Qwen2
from te_assembly.formats.hf.families.qwen2_moe import Qwen2Moe
from te_assembly.formats.hf.families.qwen3 import Qwen3
from te_assembly.formats.hf.families.qwen3_moe import Qwen3Moe

REGISTRY: tuple[Family, ...] = (
    Llama(),
    Mistral(),
    Qwen2(),
    Qwen3(),
    Mixtral(),
    Qwen2Moe(),
    Qwen3Moe(),
    Glm4Moe(),
    DeepseekV3(),
    GptOss(),
    Phi3(),
    Olmo2(),
    Gemma2(),
    Gemma3(),
)
"""Every family, in the order an export tries them (the first whose kind a model's layer is, unless the
model was imported from another that still fits it)."""

FAMILIES: dict[str, Family] = {f.architecture: f for f in REGISTRY}
"""Architecture (``config.json``'s ``architectures`` entry) -> its family."""
HONOURED: dict[str, tuple[str, ...]] = {f.architecture: f.fields for f in REGISTRY}
"""The fields each family reads (each checked: a value it cannot express is refused)."""

__all__ = [
    "CHECKED",
    "COMMON_FIELDS",
    "FAMILIES",
    "GENERATION_DEFAULTS",
    "HONOURED",
    "KEPT_FIELDS",
    "METADATA_FIELDS",
    "METADATA_PATTERNS",
    "REGISTRY",
    "REMOTE_CODE_FIELDS",
    "Family",
    "is_metadata",
]
