"""What the ``train`` job (``jobs/train.py``) builds on: checkpoints (``checkpoint.py``, and
``parallel_checkpoint.py`` for a parallel run's ranks), run directories and their lock (``run_dir.py``),
the run record a resume must match (``run_record.py``), metrics (``metrics.py``), the teacher task
(``task.py``), the optimizer and schedule (``optim.py``) and the ``train:`` settings (``settings.py``,
pure Python)."""
