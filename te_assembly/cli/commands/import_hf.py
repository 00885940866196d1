"""``import-hf HF_DIR [DEST]``: a Hugging Face checkpoint (``config.json`` + safetensors, sharded or
not, as ``save_pretrained`` or the Hub writes it) as a te_assembly pretrained directory: the weights,
the model as editable YAML (``DEST/model/<name>.yaml`` and its block), the original ``config.json``
(``hf_config.json``) and ``tokenizer.json``. Every ``config.json`` field is honoured or refused by name
(exit 2); a tensor that disagrees with it is named (exit 1); nothing is written unless all checks pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from te_assembly.analysis.analyze import Analysis
from te_assembly.diagnostics import error, printable
from te_assembly.errors import ConfigError
from te_assembly.fields import FieldSpec
from te_assembly.sections import setting


@dataclass(frozen=True)
class ImportSettings:
    """``import_hf:``: the Hugging Face checkpoint, where to import it, the model's name (``import-hf``)."""

    source: str | None = setting(
        None,
        nonempty=True,
        doc="the Hugging Face checkpoint directory, or a Hub name ORG/NAME[@REVISION] (its cache first)",
    )
    to: str | None = setting(
        None, nonempty=True, doc="the pretrained directory to write (null: ./<source name>_te)"
    )
    name: str | None = setting(
        None,
        nonempty=True,
        file_name=True,
        doc="the model's name, also its file name (null: from the destination's folder name)",
    )
    overwrite: bool = setting(False, doc="replace a directory that is not empty")
    ignore_fields: list[str] = setting(
        [],
        items=FieldSpec(str, nonempty=True),
        single_as_list=True,
        doc="config.json fields te_assembly does not know, accepted knowingly as having no effect on "
        "the model (recorded in config.yaml)",
    )
    adapter: str | None = setting(
        None, nonempty=True, doc="a PEFT LoRA adapter directory for this checkpoint: imported on its base"
    )


SECTIONS = {"import_hf": ImportSettings}


def main(analysis: Analysis, console: Console) -> int:
    settings: ImportSettings = analysis.section("import_hf")
    if settings.source is None:
        raise ConfigError(
            [
                error(
                    "import_hf.source",
                    "missing",
                    "import-hf needs a Hugging Face checkpoint directory",
                    "e.g. python -m te_assembly import-hf path/to/Mixtral-8x7B my_mixtral",
                )
            ]
        )
    from te_assembly.cli.report import tensor_progress
    from te_assembly.formats.hf.convert import import_hf, model_name, read_spec
    from te_assembly.formats.hf.hub import hub_folder, local_name

    source = hub_folder(settings.source)  # a Hub name: fetched (or found in the cache) first
    dest = Path(settings.to).expanduser() if settings.to else Path.cwd() / f"{local_name(settings.source)}_te"
    spec = read_spec(source, settings.ignore_fields)
    with tensor_progress(console, "reading") as progress:
        out = import_hf(
            source,
            dest,
            name=settings.name,
            overwrite=settings.overwrite,
            ignore_fields=settings.ignore_fields,
            progress=progress,
            adapter=settings.adapter,
        )
    name = settings.name or model_name(dest)
    console.print(
        f"imported {spec.architecture} ({spec.layers} layers, hidden {spec.hidden}, "
        f"vocab {spec.vocab}{f', {spec.experts} experts top-{spec.top_k}' if spec.experts else ''}) "
        f"into {printable(str(out))}",
        markup=False,
        soft_wrap=True,
    )
    for note in spec.notes():
        console.print(f"note: {note}", markup=False, soft_wrap=True)
    _next_steps(console, out, name, settings)
    return 0


def _next_steps(console: Console, out: Path, name: str, settings: ImportSettings) -> None:
    """Where the model's YAML is, and the commands that check, load and compare it."""
    from te_assembly.formats.pretrained import read_config

    shown = printable(str(out))
    console.print(f"the model as YAML: {shown}/model/{name}.yaml", markup=False, soft_wrap=True)
    if settings.adapter is not None:
        lora = read_config(out).get("lora")
        console.print(
            f"with the adapter of {printable(settings.adapter)}: train it further with "
            f"train.init_from={shown} and these lora settings (config.yaml's lora): {printable(str(lora))}",
            markup=False,
            soft_wrap=True,
        )
    console.print(
        f"check it:  python -m te_assembly validate -cd {shown} model={name}", markup=False, soft_wrap=True
    )
    console.print(
        f"load it:   te_assembly.from_pretrained({printable(repr(str(out)))})", markup=False, soft_wrap=True
    )
    console.print(
        f"compare:   python -m te_assembly verify hf={printable(str(settings.source))} dtype=float64",
        markup=False,
        soft_wrap=True,
    )
