"""The ``generate`` job: a language model continues a prompt (``job.py``), with its ``generate:``
settings (``settings.py``, pure Python). Names are resolved on first use."""

from __future__ import annotations

from typing import TYPE_CHECKING

from te_assembly.lazy import lazy_attributes

if TYPE_CHECKING:
    from te_assembly.jobs.generate.job import Generated, chat, generate, generate_many
    from te_assembly.jobs.generate.settings import GenerateSettings

__getattr__ = lazy_attributes(
    __name__,
    {
        "generate": "te_assembly.jobs.generate.job",
        "generate_many": "te_assembly.jobs.generate.job",
        "chat": "te_assembly.jobs.generate.job",
        "Generated": "te_assembly.jobs.generate.job",
        "GenerateSettings": "te_assembly.jobs.generate.settings",
    },
)

__all__ = ["GenerateSettings", "Generated", "chat", "generate", "generate_many"]
