"""Hugging Face checkpoints in and out (``formats/hf/``): the public names.

``from_hf(HF_DIR, target)`` builds a checkpoint as a te_assembly model (an engine name: in its dtype);
``import_hf(HF_DIR, DEST)`` writes it as a pretrained directory; ``to_hf(model, DEST)`` writes a model
as a checkpoint ``transformers`` loads; ``to_hf_state_dict(model, tensors=None)`` maps a state dict (or
anything keyed like it, such as gradients) to Hugging Face names and layouts, ``from_hf_state_dict`` back.
``FAMILIES`` lists the architectures, ``HONOURED`` the ``config.json`` fields each reads.
"""

from __future__ import annotations

from te_assembly.formats.hf.config import HFConfigError, HFSpec
from te_assembly.formats.hf.convert import (
    export_hf,
    from_hf,
    from_hf_state_dict,
    import_hf,
    read_spec,
    to_hf,
    to_hf_state_dict,
)
from te_assembly.formats.hf.families import FAMILIES, HONOURED
from te_assembly.formats.hf.layout import UnexportableError

__all__ = [
    "FAMILIES",
    "HONOURED",
    "HFConfigError",
    "HFSpec",
    "UnexportableError",
    "export_hf",
    "from_hf",
    "from_hf_state_dict",
    "import_hf",
    "read_spec",
    "to_hf",
    "to_hf_state_dict",
]
