"""Hugging Face checkpoints in and out: ``config.json`` + safetensors as te_assembly models and back.

``config.py`` reads a ``config.json`` into a ``HFSpec`` (every field honoured or refused by name),
``layout.py`` turns a spec into te_assembly YAML (the ``hf_*_layer`` blocks) and a model's plan back
into a spec, ``names.py`` maps every tensor between the two naming schemes, ``shards.py`` reads and
writes the Hub's (sharded) safetensors, ``convert.py`` is import and export, ``compare.py`` checks a
model against ``transformers``' own implementation.
"""
