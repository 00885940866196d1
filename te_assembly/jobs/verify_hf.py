"""te_assembly against ``transformers``' own implementation of the same checkpoint: logits, the
next-token cross-entropy loss and the gradient of every parameter, on the same token ids.

``transformers`` keeps float32 islands inside a float64 model (its RMSNorms, Gemma's (1 + w) ones too,
MoE routers and eager attention's softmax compute in float32 whatever the model's dtype, and its
causal-LM loss casts the logits to float32), so a float64
comparison would only ever agree to float32 rounding. ``float64_islands_removed`` gives those modules
their own formula in the input's dtype, instance by instance and only for the comparison, and the loss
of both models is the same cross-entropy of their logits; float32 comparisons run ``transformers``
untouched, its own loss included.

``verify_hf`` is the job (``verify hf=DIR``): the checkpoint imported on a target, both models run on
the same random token ids, every tensor held to ``HF_TOLERANCE`` of transformers' largest magnitude.
"""

from __future__ import annotations

import types
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from te_assembly.errors import MissingToolError
from te_assembly.jobs.events import Built, OnEvent, ignore

if TYPE_CHECKING:
    from te_assembly.analysis.settings import RunSettings
    from te_assembly.engines.base import AssembledModel
    from te_assembly.engines.target import Target

HF_TOLERANCE = {"float64": 1e-10, "float32": 1e-5, "bfloat16": 5e-2}
"""``verify hf=``: the largest difference allowed, relative to the largest magnitude of each tensor
transformers computes (float64: with its float32 islands removed)."""


@dataclass
class Comparison:
    """The largest absolute difference of each compared tensor, and the worst one."""

    dtype: str
    differences: dict[str, float] = field(default_factory=dict)
    scales: dict[str, float] = field(default_factory=dict)
    """The largest magnitude of transformers' tensor, so differences read relative to it."""

    def worst(self) -> tuple[str, float]:
        name = max(self.differences, key=lambda k: self.differences[k] / max(self.scales.get(k, 1.0), 1e-30))
        return name, self.differences[name]

    def relative(self, name: str) -> float:
        return self.differences[name] / max(self.scales.get(name, 0.0), 1e-30)

    def within(self, tolerance: float) -> bool:
        """Every tensor within ``tolerance`` of transformers', relative to its largest magnitude."""
        return all(self.relative(k) <= tolerance for k in self.differences)


def load_transformers(hf_dir: str | Path, dtype: torch.dtype) -> Any:
    """``transformers``' model of ``hf_dir`` (SDPA attention, eval mode), or ``MissingToolError``."""
    try:
        import transformers
    except ImportError:
        raise MissingToolError(
            "comparing with Hugging Face needs transformers: pip install 'te-assembly[hf]' (or transformers)"
        ) from None
    from transformers.utils import logging as hf_logging

    # Its own loading bar would interleave with te_assembly's output; the folder is read as it is (no
    # download, no remote code).
    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        config = transformers.AutoConfig.from_pretrained(str(hf_dir), local_files_only=True)
        model_class = transformers.AutoModelForCausalLM._model_mapping[type(config)]
        # SDPA where the family has it; GPT-OSS's sinks need transformers' eager attention (which takes
        # its softmax in the model's dtype there, so no float32 island comes with it)
        attention = "sdpa" if getattr(model_class, "_supports_sdpa", False) else "eager"
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(hf_dir),
            config=config,
            dtype=dtype,
            attn_implementation=attention,
            experts_implementation="eager",
            local_files_only=True,
            trust_remote_code=False,
        )
    finally:
        if shown:
            hf_logging.enable_progress_bar()
    if dtype == torch.float64:
        _full_precision(model, Path(hf_dir), dtype)
    return model.eval()


def _full_precision(model: torch.nn.Module, folder: Path, dtype: torch.dtype) -> None:
    """transformers keeps some tensors in float32 inside a float64 model (GLM-4.5's router weight and
    expert bias): each is read again from the checkpoint at its own precision, in ``dtype``, so a float64
    checkpoint is compared as it is (another of its float32 islands, removed for the comparison)."""
    from safetensors import safe_open

    narrow = {
        name: tensor
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]
        if tensor.is_floating_point() and tensor.dtype != dtype
    }
    if not narrow:
        return
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), "pt") as handle:
            for key in handle.keys():
                if key in narrow:
                    narrow[key].data = handle.get_tensor(key).to(dtype)
    for tensor in narrow.values():
        tensor.data = tensor.data.to(dtype)


def _rms_norm_forward(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def _router_forward(
    self: Any, hidden_states: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    hidden_states = hidden_states.reshape(-1, self.hidden_dim)
    logits = torch.nn.functional.linear(hidden_states, self.weight)
    probs = torch.softmax(logits, dim=-1)
    top, indices = torch.topk(probs, self.top_k, dim=-1)
    if getattr(self, "norm_topk_prob", True):  # Mixtral's router always renormalises
        top = top / top.sum(dim=-1, keepdim=True)
    return logits, top, indices


def _grouped_router_forward(
    self: Any, hidden_states: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GLM-4.5's (and DeepSeek-V3's) router in the input's dtype: sigmoid scores, the correction bias
    added for the choice only, the topk_group best of n_group groups (each scored by its best two)."""
    hidden_states = hidden_states.reshape(-1, self.hidden_dim)
    # its weight is kept in float32 inside a float64 model: the same values, in the input's dtype
    logits = torch.nn.functional.linear(hidden_states, self.weight.to(hidden_states.dtype))
    scores = logits.sigmoid()
    choice = scores + self.e_score_correction_bias.to(scores.dtype)
    grouped = choice.view(-1, self.num_group, self.num_experts // self.num_group)
    group_scores = grouped.topk(2, dim=-1)[0].sum(dim=-1)
    group_idx = torch.topk(group_scores, k=self.topk_group, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
    score_mask = group_mask.unsqueeze(-1).expand_as(grouped).reshape(-1, self.num_experts)
    choice = choice.masked_fill(~score_mask.bool(), float("-inf"))
    indices = torch.topk(choice, k=self.top_k, dim=-1, sorted=False)[1]
    weights = scores.gather(1, indices)
    if self.norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return logits, weights * self.routed_scaling_factor, indices


def _zero_centered_norm_forward(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return hidden_states * torch.rsqrt(variance + self.eps) * (1.0 + self.weight)


def zero_centered_norms() -> set[str]:
    """transformers' (1 + w) RMSNorm classes (Gemma's), as the families declare them
    (``Family.norm_islands``): ``_zero_centered_norm_forward`` restates their formula."""
    from te_assembly.formats.hf.families import REGISTRY

    return {name for family in REGISTRY for name in family.norm_islands}


@contextmanager
def _eager_softmax_in_input_dtype(model: torch.nn.Module) -> Iterator[bool]:
    """Within: transformers' eager attention (Gemma 2's: its soft-capping has no SDPA kernel) takes its
    softmax in a float64 input's dtype instead of the float32 it asks for. It calls
    ``nn.functional.softmax(..., dtype=torch.float32)``, looked up at each call, so the function is
    swapped for the comparison's forward only; other calls pass through unchanged."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) != "eager":
        yield False
        return
    original = torch.nn.functional.softmax

    def softmax(
        input: torch.Tensor, dim: int | None = None, _stacklevel: int = 3, dtype: torch.dtype | None = None
    ) -> torch.Tensor:
        if dtype == torch.float32 and input.dtype == torch.float64:
            dtype = None
        return original(input, dim=dim, _stacklevel=_stacklevel, dtype=dtype)

    torch.nn.functional.softmax = softmax  # type: ignore[assignment]
    try:
        yield True
    finally:
        torch.nn.functional.softmax = original


def grouped_routers() -> set[str]:
    """transformers' routers whose formula ``_grouped_router_forward`` restates: those the families
    declare (``Family.router_islands``)."""
    from te_assembly.formats.hf.families import REGISTRY

    return {name for family in REGISTRY for name in family.router_islands}


@contextmanager
def float64_islands_removed(model: torch.nn.Module) -> Iterator[list[str]]:
    """Within: each RMSNorm and top-k router of ``model``, and its eager attention's softmax, compute
    in the input's dtype (yields the patched modules' class names, and ``eager softmax``). Only modules
    whose formula is the one written here are patched."""
    patched: list[tuple[torch.nn.Module, Any]] = []
    grouped, centered = grouped_routers(), zero_centered_norms()
    for module in model.modules():
        name = type(module).__name__
        if name in centered and hasattr(module, "eps"):
            patched.append((module, module.forward))
            module.forward = types.MethodType(_zero_centered_norm_forward, module)  # type: ignore[method-assign]
        elif name.endswith("RMSNorm") and hasattr(module, "variance_epsilon"):
            patched.append((module, module.forward))
            module.forward = types.MethodType(_rms_norm_forward, module)  # type: ignore[method-assign]
        elif (
            name.endswith("TopKRouter")
            and hasattr(module, "top_k")
            and hasattr(module, "hidden_dim")
            and getattr(module, "bias", None) is None  # GPT-OSS's router (a bias) has no float32 island
        ):
            patched.append((module, module.forward))
            module.forward = types.MethodType(_router_forward, module)  # type: ignore[method-assign]
        elif name in grouped and hasattr(module, "e_score_correction_bias"):
            patched.append((module, module.forward))
            module.forward = types.MethodType(_grouped_router_forward, module)  # type: ignore[method-assign]
    try:
        with _eager_softmax_in_input_dtype(model) as eager:
            yield sorted({type(m).__name__ for m, _ in patched} | ({"eager softmax"} if eager else set()))
    finally:
        for module, forward in patched:
            module.forward = forward  # type: ignore[method-assign]


def compare(model: AssembledModel, hf_model: Any, token_ids: torch.Tensor) -> Comparison:
    """Run both on ``token_ids`` ``[batch, seq]`` (in ``model``'s dtype; float64 with the islands
    removed) and compare logits, loss and every parameter's gradient (by te_assembly name, each also
    the tensors' Hugging Face names in ``names``)."""
    from te_assembly.formats.hf.convert import from_hf_state_dict
    from te_assembly.formats.hf.layout import Outline

    dtype = next(model.parameters()).dtype
    result = Comparison(str(dtype).removeprefix("torch."))
    model.zero_grad(set_to_none=True)
    hf_model.zero_grad(set_to_none=True)
    logits = model(token_ids).y
    loss = next_token_loss(logits, token_ids)
    loss.backward()
    if dtype == torch.float64:
        with float64_islands_removed(hf_model):
            hf_logits = hf_model(input_ids=token_ids).logits
            hf_loss = next_token_loss(hf_logits, token_ids)
    else:
        out = hf_model(input_ids=token_ids, labels=token_ids)
        hf_logits, hf_loss = out.logits, out.loss
    hf_loss.backward()
    _record(result, "logits", logits.detach(), hf_logits.detach())
    _record(result, "loss", loss.detach(), hf_loss.detach())
    theirs = from_hf_state_dict(
        model, {n: p.grad for n, p in hf_model.named_parameters() if p.grad is not None}
    )
    from te_assembly.jobs.verify import state_dict_parameters

    # By state-dict name: TE's own Linear also lists its weights under shorter names.
    mine = {n: p.grad for n, p in state_dict_parameters(model).items()}
    tied = model.plan.tied_params
    # transformers loads no multi-token prediction module: those weights have nothing to compare with
    unmodelled = tuple(f"steps.{step.name}." for step in Outline(model.plan).mtp)
    for name in sorted(mine):
        if name.startswith(unmodelled):
            continue
        key = tied.get(name, name)
        if key not in theirs:
            raise RuntimeError(f"transformers' model has no gradient for {name}")
        grad = mine[name]
        _record(
            result, f"grad {name}", grad if grad is not None else torch.zeros_like(theirs[key]), theirs[key]
        )
    return result


def next_token_loss(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of each position's logits against the next token id, in at least float32."""
    flat = logits[:, :-1].reshape(-1, logits.shape[-1])
    return torch.nn.functional.cross_entropy(
        flat.to(torch.promote_types(flat.dtype, torch.float32)), token_ids[:, 1:].reshape(-1)
    )


def _record(result: Comparison, name: str, mine: torch.Tensor, theirs: torch.Tensor) -> None:
    if mine.shape != theirs.shape:
        raise RuntimeError(
            f"{name}: te_assembly's shape {tuple(mine.shape)} vs transformers' {tuple(theirs.shape)}"
        )
    diff = (mine.double() - theirs.double()).abs().max().item() if mine.numel() else 0.0
    result.differences[name] = float(diff)
    result.scales[name] = float(theirs.double().abs().max().item()) if theirs.numel() else 0.0


@dataclass(frozen=True)
class HFReport:
    """What ``verify_hf`` found: every tensor's difference from transformers' and the verdict."""

    source: str
    architecture: str
    engine: str
    dtype: str
    seq_len: int
    tolerance: float
    comparison: Comparison
    notes: tuple[str, ...] = ()
    """What the import left out of ``config.json``'s model (``HFSpec.notes``)."""

    @property
    def passed(self) -> bool:
        return self.comparison.within(self.tolerance)

    def json(self) -> dict[str, Any]:
        """What ``verify.json`` holds."""
        return {
            "hf": self.source,
            "architecture": self.architecture,
            "dtype": self.dtype,
            "tolerance": self.tolerance,
            "differences": self.comparison.differences,
            "scales": self.comparison.scales,
            "passed": self.passed,
        }


def verify_hf(
    source: str | Path,
    target: Target | str,
    settings: RunSettings | None = None,
    *,
    ignore_fields: Sequence[str] = (),
    on_event: OnEvent = ignore,
) -> HFReport:
    """The Hugging Face checkpoint ``source`` imported on ``target`` against ``transformers``' own model
    of it, in ``target.dtype``: logits, loss and every gradient on 2 sequences of ``settings.seq_len``
    random token ids drawn from ``target.seed`` (``compare``). ``ignore_fields``: as ``import-hf``'s
    (``import_hf.ignore_fields``)."""
    from te_assembly.analysis.settings import RunSettings
    from te_assembly.engines.target import as_target
    from te_assembly.formats.hf.convert import from_hf, read_spec
    from te_assembly.formats.hf.hub import hub_folder

    target = as_target(target)
    settings = settings if settings is not None else RunSettings()
    source = hub_folder(source)  # a Hub name's snapshot, or the folder itself
    spec = read_spec(source, ignore_fields)
    model = from_hf(source, target, ignore_fields=ignore_fields)
    on_event(Built(model))
    device = next(model.parameters()).device
    theirs = load_transformers(source, target.dtype).to(device)
    generator = torch.Generator().manual_seed(target.seed)
    ids = torch.randint(0, spec.vocab, (2, settings.seq_len), generator=generator).to(device)
    result = compare(model.train(), theirs.train(), ids)
    return HFReport(
        str(source),
        spec.architecture,
        model.engine,
        target.dtype_name,
        settings.seq_len,
        HF_TOLERANCE[target.dtype_name],
        result,
        tuple(spec.notes()),
    )


__all__ = ["HF_TOLERANCE", "Comparison", "HFReport", "compare", "float64_islands_removed", "verify_hf"]
