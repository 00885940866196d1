"""What te_assembly shows: a plan as tables (``explain.py``, ``fusions.py``, ``parallel_report.py``,
``outline.py``) and as a graph (``graph_view.py`` builds it, ``graph.py`` draws it), a built model
(``model.py``: ``model.summary()`` and ``model.plot()``), a training run (``training.py``'s lines and
``loss_curve.py``'s picture). Views sit above the jobs and below the command line; the ones of a plan
import no torch."""
