"""The jobs, and only jobs: ``run.py``, ``verify.py`` (and ``verify_hf.py``, against ``transformers``),
``generate/``, ``bench/`` and ``train/`` (the train job's one home). Every job is
``job(plan_or_model, target, settings, *, on_event=...)``: a ``Target`` (``engines/target.py``) and the
job's own settings section in, a result object out; none prints or exits (the CLI and the views render
the results and events).

What they share lives beside them: ``objective.py`` (the loss), ``optimizer.py`` (the optimizer train
steps with and bench times), ``events.py`` (progress). Packages resolve their names on first use, so
their settings modules import without torch.
"""
