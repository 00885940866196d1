"""Import and export: a Hugging Face checkpoint directory as a te_assembly model, and back.

Import reads ``config.json`` (``config.py``: every field honoured or refused), writes the model as
te_assembly YAML (``layout.py``), checks every tensor's shape against the model before reading any
(from the safetensors headers), then reads them one at a time from the memory-mapped shards
(``shards.py``) into their te_assembly names and layouts (``names.py``). Export goes through the same
table the other way. ``transformers`` is needed for neither.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import yaml

from te_assembly.data.tokenizer import text_fingerprint
from te_assembly.diagnostics import printable
from te_assembly.engines.target import Target, for_source
from te_assembly.errors import ArgumentError, CheckpointError
from te_assembly.files.directory import HF, PRETRAINED, check_destination, recover, write_directory
from te_assembly.files.names import as_file_name, safe_name
from te_assembly.files.read import LIMITS, InputFileError, read_text
from te_assembly.formats.companions import (
    COMPANIONS,
    GENERATION_CONFIG,
    SOURCE_CONFIG,
    TOKENIZER_FILE,
    read_companions,
    source_metadata,
)
from te_assembly.formats.hf.config import FAMILIES, KEPT_FIELDS, HFSpec, parse_config, read_config
from te_assembly.formats.hf.hub import hub_folder
from te_assembly.formats.hf.layout import model_config
from te_assembly.formats.hf.mapping import hf_config, mapping_of_plan
from te_assembly.formats.hf.names import Rule, chosen_layout, gather, hub_tensors
from te_assembly.formats.hf.shards import INDEX, SINGLE, HFCheckpoint, write_shards
from te_assembly.formats.hf.tensor_plan import Progress, stream, tensor_plan
from te_assembly.formats.pretrained import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    check_finite,
    config_of,
    sources_of,
    weights_dtype,
    write_pretrained,
)

if TYPE_CHECKING:
    from te_assembly.analysis.analyze import Analysis
    from te_assembly.analysis.plan import Plan
    from te_assembly.engines.base import AssembledModel


IMPORTED_COMPANIONS = {"config.json": SOURCE_CONFIG, **{n: n for n in COMPANIONS if n != SOURCE_CONFIG}}
"""What an import keeps of a Hugging Face checkpoint besides its weights (``config.json`` as
``hf_config.json``)."""
DEFAULT_SHARD_BYTES = 5 * 2**30
"""The Hub's default shard size (``save_pretrained(max_shard_size="5GB")``)."""


def read_spec(hf_dir: str | os.PathLike[str], ignore_fields: Sequence[str] = ()) -> HFSpec:
    """The ``HFSpec`` of ``hf_dir``'s ``config.json`` (``HFConfigError`` names every refused field);
    ``ignore_fields``: fields te_assembly does not know, accepted knowingly."""
    folder = _hf_folder(hf_dir)
    path = folder / "config.json"
    spec = parse_config(read_config(path, within=folder), path, ignore_fields)
    if spec.mtp_modules and _holds_weights(folder):
        with HFCheckpoint(folder) as checkpoint:
            first = f"model.layers.{spec.layers}."
            if not any(name.startswith(first) for name in checkpoint):
                # transformers' own save: the layers declared, none of their tensors written
                spec = dataclasses.replace(spec, mtp_modules=0)
    return spec


def _holds_weights(folder: Path) -> bool:
    """Whether ``folder`` has a checkpoint's weights beside its ``config.json`` (a folder of the
    config alone describes the model it declares)."""
    return any((folder / name).exists() for name in (SINGLE, INDEX))


def _hf_folder(hf_dir: str | os.PathLike[str]) -> Path:
    if not isinstance(hf_dir, (str, os.PathLike)):
        raise ArgumentError(f"a Hugging Face checkpoint directory is a path, not {type(hf_dir).__name__}")
    folder = hub_folder(hf_dir)  # a Hub name's snapshot, or the path itself
    recover(folder)
    if not folder.is_dir():
        raise CheckpointError(
            f"{folder} is not a directory (a Hugging Face checkpoint is a directory with config.json, or a "
            "Hub name: ORG/NAME[@REVISION])"
        )
    return folder


def analysis_of(spec: HFSpec, name: str) -> tuple[Analysis, dict[str, Any]]:
    """The checked te_assembly model of ``spec``, and the model mapping it was loaded from."""
    from te_assembly.analysis.pipeline import load

    model = model_config(spec, name)
    analysis = load(model)
    analysis.checked_plan()
    return analysis, model


def model_name(dest: Path) -> str:
    """A model name from a directory name: letters, digits and underscores (always one safe file name)."""
    name = as_file_name(re.sub(r"\W+", "_", dest.name).strip("_")[:100], "imported", r"\w")
    return name if not name[0].isdigit() else f"m_{name}"


def import_hf(
    hf_dir: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    *,
    name: str | None = None,
    overwrite: bool = False,
    ignore_fields: Sequence[str] = (),
    progress: Progress | None = None,
    adapter: str | os.PathLike[str] | None = None,
) -> Path:
    """Turn the Hugging Face checkpoint ``hf_dir`` into the pretrained directory ``dest`` (what
    ``from_pretrained`` loads): ``model.safetensors`` and ``config.yaml``, the model as te_assembly YAML
    (``model/<name>.yaml`` and its blocks in ``block/``, so ``-cd DEST model=<name>`` validates,
    explains and trains it), the checkpoint's ``config.json`` as ``hf_config.json`` and its
    ``tokenizer.json``. Nothing is written unless everything checks: ``dest`` is whole or absent.
    ``ignore_fields``: ``config.json`` fields te_assembly does not know, accepted knowingly (recorded
    in ``config.yaml`` as ``hf_ignored_fields``). ``adapter``: a PEFT LoRA adapter directory for this
    checkpoint, imported on it (the model in ``config.yaml`` has its branches, the weights hold base and
    adapters, and ``config.yaml``'s ``lora`` holds the section that rebuilds them)."""
    folder = _hf_folder(hf_dir)
    out = Path(dest).expanduser()
    model_id = safe_name(name, "import_hf.name") if name is not None else model_name(out)
    check_destination(out, PRETRAINED, overwrite=overwrite, sources=[folder])
    spec = read_spec(folder, ignore_fields)
    companions = read_companions(folder, IMPORTED_COMPANIONS)
    fingerprint = None
    if TOKENIZER_FILE in companions:
        fingerprint = text_fingerprint(companions[TOKENIZER_FILE], str(folder / TOKENIZER_FILE))
    analysis, model = analysis_of(spec, model_id)
    plan = analysis.checked_plan()
    dtype = getattr(torch, spec.dtype)
    _check_import_fits(plan, dtype, f"importing {spec.architecture} from {folder}")
    with HFCheckpoint(folder) as checkpoint:
        chosen = tensor_plan(spec, plan, checkpoint)
        weights = dict(stream(chosen, checkpoint, dtype, progress))
    from te_assembly.formats.model_record import model_record

    files = {f"model/{model_id}.yaml": "", **_own_blocks(model, model_id), **companions}
    files[f"model/{model_id}.yaml"] = _model_yaml(model, folder)  # its blocks renamed by _own_blocks
    lora = None
    if adapter is not None:
        from te_assembly.formats.adapters import from_peft_tensors, peft_adapter_plan, read_peft

        peft_config, peft_weights = read_peft(adapter)
        plan, lora = peft_adapter_plan(plan, peft_config, adapter)
        weights.update({k: v.to(dtype) for k, v in from_peft_tensors(plan, peft_weights).items()})
    config = config_of(model_record(plan), None, spec.dtype, plan.tied_params, fingerprint)
    if lora is not None:
        config["lora"] = lora
    if ignore_fields:
        config["hf_ignored_fields"] = sorted(set(ignore_fields))
    sources = [folder, *([Path(adapter).expanduser()] if adapter is not None else [])]
    return write_pretrained(out, weights, config, overwrite=overwrite, files=files, sources=sources)


def _check_import_fits(plan: Plan, dtype: torch.dtype, what: str) -> None:
    """The converted weights are held once in memory before they are written (the shards stay mapped):
    ``ResourceError`` before any is read when they cannot be."""
    from te_assembly.engines.memory import check_fits, estimate

    check_fits(estimate(plan, dtype), torch.device("cpu"), what, "free memory first")


def _own_blocks(model: dict[str, Any], model_id: str) -> dict[str, str]:
    """Each shipped block the model uses, copied under the model's own name (and the model's steps
    pointed at the copies): the directory is complete on its own, and an edit to it never shadows (or is
    shadowed by) the shipped block it started as."""
    from te_assembly.config.locations import configs_dir

    files: dict[str, str] = {}
    for op in model["ops"]:
        shipped = op.get("block")
        if shipped is None:
            continue
        block = f"{model_id}_{op['name'].removesuffix('s')}"  # layers: <id>_layer; dense_layers too
        block_text = (configs_dir() / "block" / f"{shipped}.yaml").read_text(encoding="utf-8")
        block_text = re.sub(rf"(?m)^name: {shipped}$", f"name: {block}", block_text)
        op["block"] = block
        files[f"block/{block}.yaml"] = (
            f"# {block}: a copy of te_assembly's {shipped} block, for this model.\n{block_text}"
        )
    return files


def _model_yaml(model: Mapping[str, Any], source: Path) -> str:
    header = (
        f"# Imported from {printable(source.name)} ({model['description'].split(' as ')[0]}) by te_assembly "
        "import-hf.\n"
        "# Every dim is a config.json field (hf_config.json beside this folder); edit them to change the\n"
        "# model, e.g. python -m te_assembly validate -cd <this pretrained directory> model=<name>.\n"
    )
    return header + yaml.safe_dump(dict(model), sort_keys=False, default_flow_style=False)


def from_hf(
    hf_dir: str | os.PathLike[str],
    target: Target | str = "auto",
    *,
    ignore_fields: Sequence[str] = (),
    progress: Progress | None = None,
) -> AssembledModel:
    """Build the Hugging Face checkpoint ``hf_dir`` as a te_assembly model on ``target`` (an engine name:
    in the checkpoint's dtype) and load its weights tensor by tensor. The memory estimate checks the
    target's device first; every shape is checked before a tensor is read."""
    folder = _hf_folder(hf_dir)
    spec = read_spec(folder, ignore_fields)
    analysis, _ = analysis_of(spec, model_name(folder))
    plan = analysis.checked_plan()
    chosen = for_source(target, getattr(torch, spec.dtype))
    chosen.check_fits(
        plan,
        f"{spec.architecture} from {folder}",
        "load it in a narrower dtype or on a device with more memory",
    )
    with HFCheckpoint(folder) as checkpoint:
        tensors = tensor_plan(spec, plan, checkpoint)
        model = chosen.build(plan)
        state = model.state_dict()
        with torch.no_grad():
            for te_name, tensor in stream(tensors, checkpoint, chosen.dtype, progress):
                state[te_name].copy_(tensor)
    return model.eval()


def _mapping(
    model: AssembledModel,
    metadata: Mapping[str, Any] | None = None,
    available: Collection[str] | None = None,
) -> tuple[HFSpec, list[Rule]]:
    """The spec ``model`` expresses and its rules under the model's own step names."""
    return mapping_of_plan(model.plan, metadata, available)


def to_hf_state_dict(
    model: AssembledModel, tensors: Mapping[str, torch.Tensor] | None = None
) -> dict[str, torch.Tensor]:
    """``tensors`` (default: ``model``'s state dict; or anything keyed like it, such as each
    parameter's gradient by ``named_parameters`` name) under Hugging Face names and layouts. A tied
    weight appears once, as ``model.embed_tokens.weight``. ``UnexportableError`` for a model no family
    expresses."""
    _, table = _mapping(model)
    if tensors is None:
        return hub_tensors(table, dict(model.state_dict()))
    # Keys may be named_parameters() names (TE's own Linear lists its weights under shorter ones too).
    by_id = {id(t): k for k, t in model.state_dict(keep_vars=True).items()}
    aliases = {n: by_id[id(p)] for n, p in model.named_parameters(remove_duplicate=False) if id(p) in by_id}
    source = {aliases.get(k, k): v for k, v in tensors.items()}
    return hub_tensors(table, source)


def from_hf_state_dict(model: AssembledModel, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of ``to_hf_state_dict``: Hugging Face-named ``tensors`` (the Hub layout or the
    stacked-expert one) under ``model``'s own names, ready for ``model.load_state_dict``; the family
    whose names they are, where several express the model."""
    _, table = _mapping(model, available=tensors.keys())
    out = {}
    for rule in table:
        layout = chosen_layout(rule, tensors)
        if layout is not None:
            out[rule.te] = gather(layout, tensors)
    return out


def to_hf(
    model: AssembledModel,
    dest: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    tokenizer: str | os.PathLike[str] | None = None,
    metadata: Mapping[str, Any] | None = None,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
    progress: Progress | None = None,
    companions: Mapping[str, str] | None = None,
    sources: Sequence[str | os.PathLike[str]] = (),
) -> Path:
    """Write ``model`` as a Hugging Face checkpoint directory ``dest``: ``config.json``,
    ``generation_config.json``, safetensors in the Hub layout (sharded past ``max_shard_bytes``) and the
    ``tokenizer`` when given, all or nothing, through the guarded directory writer. ``metadata``: an
    imported checkpoint's own fields (token ids, context length, architecture) to keep; ``companions``:
    its tokenizer and generation files (``formats.companions``). ``UnexportableError`` names the step no
    family expresses."""
    from te_assembly.engines.base import AssembledModel

    if not isinstance(model, AssembledModel):
        raise ArgumentError(f"to_hf() takes a model built by te_assembly; got {type(model).__name__}")
    if not isinstance(max_shard_bytes, int) or max_shard_bytes <= 0:
        raise ArgumentError(f"max_shard_bytes must be a positive integer, got {max_shard_bytes!r}")
    if model.plan.adapter_params:
        raise ArgumentError(
            f"{model.plan.name} has LoRA adapters, which a Hugging Face checkpoint has no place for: merge "
            "them into the base (export.merge=true, formats.adapters.merged_model) or write them alone in "
            "PEFT's format (export.format=peft)"
        )
    check_destination(dest, HF, overwrite=overwrite, sources=sources)
    spec, table = _mapping(model, metadata)
    state = {
        k: v.detach().to("cpu") for k, v in model.state_dict().items() if not k.endswith("._extra_state")
    }
    check_finite(state, f"{model.plan.name}'s parameters")
    dtype = weights_dtype(state)
    hf_tensors = hub_tensors(table, state)
    files = _hf_files(spec, dtype, companions, tokenizer)

    def fill(staging: Path) -> None:
        items = sorted(hf_tensors.items())

        def counted() -> Iterator[tuple[str, torch.Tensor]]:
            for done, item in enumerate(items, start=1):
                yield item
                if progress is not None:
                    progress(done, len(items), item[0])

        write_shards(staging, counted(), max_shard_bytes)
        for name, text in files.items():
            (staging / name).write_text(text, encoding="utf-8")

    return write_directory(dest, HF, fill, overwrite=overwrite, sources=sources)


def _hf_files(
    spec: HFSpec, dtype: str, companions: Mapping[str, str] | None, tokenizer: str | os.PathLike[str] | None
) -> dict[str, str]:
    """The files of an export besides its weights: ``config.json``, the source's companions (its
    ``generation_config.json``, or one of the spec's special token ids) and the ``tokenizer`` given."""
    files = {k: v for k, v in (companions or {}).items() if k != SOURCE_CONFIG}
    if tokenizer is not None:
        try:
            files[TOKENIZER_FILE] = read_text(Path(tokenizer).expanduser(), limit=LIMITS["tokenizer"])
        except InputFileError as exc:
            raise ArgumentError(f"to_hf(tokenizer=...): {exc}") from None
    files["config.json"] = json.dumps(hf_config(spec, dtype), indent=2) + "\n"
    if GENERATION_CONFIG not in files:
        ids = ("bos_token_id", "eos_token_id", "pad_token_id")
        generation = {k: spec.metadata[k] for k in ids if spec.metadata.get(k) is not None}
        files[GENERATION_CONFIG] = json.dumps(generation, indent=2) + "\n"
    return files


def export_source(
    source: str | os.PathLike[str], check: Callable[[Path], None] | None = None
) -> tuple[AssembledModel, Path, Path]:
    """What ``export`` reads: a pretrained directory, or a training run (its newest good checkpoint) or a
    checkpoint file, as a reference-engine model; with the file it was read from and its folder (where
    its companions are). ``check(read_from)`` runs before anything is loaded (the destination's
    checks, so a refusal costs no load)."""
    from te_assembly.formats.pretrained import from_checkpoint, from_pretrained, newest_checkpoint

    folder = Path(source).expanduser()
    recover(folder)
    pretrained = (
        (folder / WEIGHTS_FILE).is_file()
        and (folder / CONFIG_FILE).is_file()
        and not any(folder.glob("ckpt-*.safetensors"))
    )
    read_from = folder if pretrained else newest_checkpoint(folder, "export")
    if check is not None:
        check(read_from)
    model = from_pretrained(folder, "reference") if pretrained else from_checkpoint(read_from, "reference")
    return model, read_from, folder if folder.is_dir() else folder.parent


def export_hf(
    source: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
    progress: Progress | None = None,
    merge: bool = False,
) -> Path:
    """``export SOURCE DEST format=hf``: a pretrained directory or a training run (its newest good
    checkpoint) as a Hugging Face checkpoint directory, with everything the source keeps beside its
    weights: the tokenizer files, the generation config and, for a model imported (or fine-tuned from
    an import), the original checkpoint's context length and special token ids. ``merge``: a model with
    LoRA adapters, folded into its base (a checkpoint has no place for them otherwise)."""

    sources: list[Path] = []

    def check(read_from: Path) -> None:
        sources.extend(sources_of(read_from))  # read once, for this check and the writer's
        check_destination(dest, HF, overwrite=overwrite, sources=sources)

    model, _, base = export_source(source, check)
    if merge:
        from te_assembly.formats.adapters import merged_model

        if not model.plan.adapter_params:
            raise ArgumentError(f"{source} has no adapters to merge (export.merge=true is for LoRA runs)")
        model = merged_model(model)
    return to_hf(
        model,
        dest,
        overwrite=overwrite,
        metadata=source_metadata(base, KEPT_FIELDS),
        max_shard_bytes=max_shard_bytes,
        progress=progress,
        companions=read_companions(base),
        sources=sources,
    )


__all__ = [
    "FAMILIES",
    "export_hf",
    "from_hf",
    "from_hf_state_dict",
    "hf_config",
    "import_hf",
    "read_spec",
    "to_hf",
    "to_hf_state_dict",
]
