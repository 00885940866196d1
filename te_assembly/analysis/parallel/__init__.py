"""Running one model on many processes launched by ``torchrun``: data, tensor, sequence and expert
parallelism. See the README's "Parallel runs".

Pure-Python parts (importable without torch, used by ``validate`` and ``explain``): ``settings`` (the
``parallel:`` section), ``layout`` (which rank holds which slice), ``checks`` (config-time diagnostics),
``launch`` (torchrun's environment), ``report`` (explain's tables). The rest imports torch: ``mesh``
(process groups), ``collectives`` (autograd-aware communication), ``tensor_ops`` and ``expert_ops``
(sharded reference ops), ``context`` (what engines and loops call), ``build``, ``checkpoint``, ``runtime``.
"""

from __future__ import annotations

from te_assembly.analysis.parallel.checks import parallel_diagnostics, tokens_diagnostics
from te_assembly.analysis.parallel.launch import Launch, current_launch
from te_assembly.analysis.parallel.layout import ParamShard, ShardPlan, StepShard, shard_plan
from te_assembly.analysis.parallel.settings import ParallelSettings

__all__ = [
    "Launch",
    "ParallelSettings",
    "ParamShard",
    "ShardPlan",
    "StepShard",
    "current_launch",
    "parallel_diagnostics",
    "shard_plan",
    "tokens_diagnostics",
]
