"""Every file format te_assembly reads and writes, in one place: training checkpoints (``checkpoint/``:
one entry, ``checkpoint.save``/``load``, for every run, one process or many), pretrained directories
(``pretrained.py``), the model record they share (``model_record.py``) and Hugging Face checkpoints
(``hf/``: ``config.json`` read into a spec, the families, the YAML layout, tensor names, the Hub's shards,
import and export). Their errors are ``te_assembly.errors``' (``CheckpointError``...)."""
