"""The jobs: ``run``, ``verify``, ``train`` and ``bench``, one file each, each a function of a plan, a
``Target`` (``target.py``: engine, kernels, device, dtype, recipe, parallel layout, seed) and its own
settings section, returning a result object. None prints or exits: the CLI renders their results.

Support the jobs share lives beside them: ``objective.py`` (the loss), ``events.py`` (progress),
``training/`` (checkpoints, run directories, the teacher task), ``benchmark/`` (timers, FLOPs, variants),
``pretrained.py`` (``save_pretrained``/``from_pretrained``/``export``). Names are imported on first use,
so the settings modules import without torch.
"""
