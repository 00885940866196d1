"""lm-evaluation-harness on te_assembly models: ``model.py`` answers lm-eval's requests (``--model
te_assembly``), ``run.py`` runs its tasks from ``eval`` and the Python API, ``cli.py`` is lm-eval's own
command line with the model registered. Nothing here imports lm-eval until it is used."""
