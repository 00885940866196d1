"""lm-eval's tasks on a te_assembly model: ``eval SOURCE eval.tasks=[...]`` and ``evaluate_tasks``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from te_assembly.diagnostics import did_you_mean, error
from te_assembly.engines.base import AssembledModel
from te_assembly.engines.target import Target
from te_assembly.errors import ConfigError, MissingToolError
from te_assembly.jobs.eval.settings import EvalSettings

INSTALL = "pip install 'te_assembly[eval]' (lm-eval)"


def harness() -> Any:
    """lm-eval, with te_assembly's model registered in it; ``MissingToolError`` without the extra."""
    try:
        import lm_eval
    except ImportError:
        raise MissingToolError(f"scoring lm-eval tasks needs lm-evaluation-harness: {INSTALL}") from None
    import te_assembly.jobs.harness.model  # noqa: F401  (registers --model te_assembly)

    return lm_eval


def task_manager(settings: EvalSettings) -> Any:
    """lm-eval's task index, with ``eval.include_path``'s tasks; ``ConfigError`` for a task it does not
    know (each named, with the nearest known name)."""
    from lm_eval.tasks import TaskManager

    include = None
    if settings.include_path is not None:
        include = str(Path(settings.include_path).expanduser())
        if not Path(include).is_dir():
            message = f"eval.include_path={settings.include_path} is not a folder of task YAML files"
            raise ConfigError([error("eval.include_path", "not-a-folder", message)])
    manager = TaskManager(include_path=include)
    known = set(manager.all_tasks)
    unknown = [t for t in settings.tasks if t not in known and not manager.match_tasks([t])]
    if unknown:
        raise ConfigError(
            [
                error(
                    "eval.tasks",
                    "unknown-name",
                    f"lm-eval has no task {task!r}",
                    did_you_mean(task, sorted(known)) or "python -m lm_eval ls tasks lists them",
                )
                for task in unknown
            ]
        )
    return manager


def evaluate_tasks(
    model: AssembledModel | str | os.PathLike[str],
    target: Target | str = "auto",
    settings: EvalSettings | None = None,
    *,
    samples: bool = False,
) -> dict[str, Any]:
    """lm-eval's ``simple_evaluate`` of ``settings.tasks`` on ``model`` (built, or a source loaded on
    ``target``): its whole result (``results``, ``n-shot``, ``versions``...; ``samples``: each
    document's requests and answers too)."""
    from te_assembly.jobs.harness.model import TEAssemblyLM

    settings = settings if settings is not None else EvalSettings()
    lm_eval = harness()
    manager = task_manager(settings)
    source = None
    if not isinstance(model, AssembledModel):  # loaded as every other job loads a source
        from te_assembly.jobs.generate.job import load_source

        source = str(Path(model).expanduser())
        model = load_source(source, target)
    lm = TEAssemblyLM(model, source=source, batch_size=settings.batch, max_gen_toks=settings.max_gen_toks)
    result: dict[str, Any] = lm_eval.simple_evaluate(
        model=lm,
        tasks=list(settings.tasks),
        num_fewshot=settings.num_fewshot,
        limit=settings.limit,
        task_manager=manager,
        log_samples=samples,
    )
    return result


__all__ = ["INSTALL", "evaluate_tasks", "harness", "task_manager"]
