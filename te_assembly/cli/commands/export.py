"""``export``: a training checkpoint as a pretrained model directory, ``model.safetensors`` (weights
only, plain parameter names) and ``config.yaml`` (the model as trained), which
``te_assembly.from_pretrained(DIR, "reference" or "te")`` loads in either engine. ``export.format=hf``:
a run or a pretrained directory as a Hugging Face checkpoint (``config.json``, Hub-layout safetensors,
``generation_config.json``, the tokenizer), for the model families ``import-hf`` reads.

``export RUN_DIR [DEST]`` (or ``export.checkpoint=... export.to=...``). ``export.checkpoint`` is a
checkpoint file, or a run directory (its newest checkpoint, every tensor verified; a corrupt newest one
is refused, naming the newest good one). ``export.to`` defaults to ``pretrained/`` in the checkpoint's
run directory; a directory that is not empty is refused unless ``export.overwrite=true``. A checkpoint
of a parallel run holds global tensors: its export loads in one process.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console

from te_assembly.analysis.analyze import Analysis
from te_assembly.diagnostics import error, printable
from te_assembly.errors import ConfigError
from te_assembly.sections import setting


@dataclass(frozen=True)
class ExportSettings:
    """``export:``: the checkpoint or run to export, where to, in which format (``export SOURCE DEST``)."""

    checkpoint: str | None = setting(
        None, nonempty=True, doc="a checkpoint file, or a run directory (its newest good checkpoint)"
    )
    to: str | None = setting(None, nonempty=True, doc="the directory to write (null: <run dir>/pretrained)")
    overwrite: bool = setting(False, doc="write into a directory that is not empty")
    format: str = setting(
        "te",
        choices=("te", "hf", "peft"),
        doc="te: a pretrained directory; hf: a Hugging Face one; peft: a LoRA run's adapters alone, for PEFT",
    )
    merge: bool = setting(False, doc="a LoRA run: its adapters folded into the base's weights (te or hf)")
    max_shard_mb: int = setting(5120, minimum=1, doc="format=hf: the largest safetensors shard, in MiB")


SECTIONS = {"export": ExportSettings}


def main(analysis: Analysis, console: Console) -> int:
    settings: ExportSettings = analysis.section("export")
    if settings.checkpoint is None:
        message = "export needs export.checkpoint: a checkpoint file or a run directory"
        hint = "e.g. export outputs/moe_block/<date>_<time> (or export.checkpoint=...)"
        raise ConfigError([error("export.checkpoint", "missing", message, hint)])
    if settings.format == "hf":
        return _export_hf(settings, console)
    if settings.format == "peft":
        return _export_peft(settings, console)
    from te_assembly.formats.pretrained import CONFIG_FILE, WEIGHTS_FILE, export_checkpoint

    out = export_checkpoint(
        settings.checkpoint, settings.to, overwrite=settings.overwrite, merge=settings.merge
    )
    size = (out / WEIGHTS_FILE).stat().st_size / 2**20
    console.print(
        f"wrote {printable(str(out / WEIGHTS_FILE))} ({size:,.2f} MiB) and "
        f"{printable(str(out / CONFIG_FILE))}",
        markup=False,
        soft_wrap=True,
    )
    console.print(
        f"load it with: te_assembly.from_pretrained({printable(repr(str(out)))}, 'reference' or 'te')",
        markup=False,
        soft_wrap=True,
    )
    return 0


def _export_hf(settings: ExportSettings, console: Console) -> int:
    from pathlib import Path

    from te_assembly.cli.report import tensor_progress
    from te_assembly.formats.hf.convert import export_hf

    assert settings.checkpoint is not None
    source = Path(settings.checkpoint).expanduser()
    dest = settings.to or str((source if source.is_dir() else source.parent) / "hf")
    with tensor_progress(console, "writing") as progress:
        out = export_hf(
            source,
            dest,
            overwrite=settings.overwrite,
            max_shard_bytes=settings.max_shard_mb * 2**20,
            progress=progress,
            merge=settings.merge,
        )
    files = sorted(p.name for p in out.iterdir())
    console.print(f"wrote {printable(str(out))}: {printable(', '.join(files))}", markup=False, soft_wrap=True)
    console.print(
        f"load it with: transformers.AutoModelForCausalLM.from_pretrained({printable(repr(str(out)))})",
        markup=False,
        soft_wrap=True,
    )
    return 0


def _export_peft(settings: ExportSettings, console: Console) -> int:
    from pathlib import Path

    from te_assembly.files.directory import PEFT, check_destination
    from te_assembly.formats.adapters import write_peft
    from te_assembly.formats.hf.convert import export_source
    from te_assembly.formats.pretrained import sources_of

    assert settings.checkpoint is not None
    if settings.merge:
        message = (
            "export.merge=true writes a whole model (format te or hf); format=peft writes the adapters alone"
        )
        raise ConfigError([error("export.merge", "conflicting-settings", message, "drop export.merge")])
    given = Path(settings.checkpoint).expanduser()
    dest = (
        Path(settings.to).expanduser()
        if settings.to
        else (given if given.is_dir() else given.parent) / "adapter"
    )

    sources: list[Path] = []

    def check(read_from: Path) -> None:  # refused before the model loads
        sources.extend(sources_of(read_from))  # read once, for this check and the writer's
        check_destination(dest, PEFT, overwrite=settings.overwrite, sources=sources)

    model, _, _ = export_source(given, check)
    weights = {k: v for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
    out = write_peft(model.plan, weights, dest, overwrite=settings.overwrite, sources=tuple(sources))
    console.print(
        f"wrote {printable(str(out))}: adapter_config.json, adapter_model.safetensors",
        markup=False,
        soft_wrap=True,
    )
    console.print(
        f"load it with: peft.PeftModel.from_pretrained(base_model, {printable(repr(str(out.resolve())))})",
        markup=False,
        soft_wrap=True,
    )
    return 0
