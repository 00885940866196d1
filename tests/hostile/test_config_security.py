"""A config can neither run code nor change the environment: ``hydra.job.env_set`` / ``env_copy`` (the
environment of every program a command runs: Graphviz's ``dot``, the compiler) and ``pkg://`` search
paths (Hydra imports the package they name) are refused with their key path, from an override or from a
user's primary config, before Hydra acts on them. And nothing that points at remote code (``auto_map``)
is carried from an imported checkpoint into anything te_assembly writes."""

from __future__ import annotations

import json
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

import te_assembly
from tests.conftest import REPO_ROOT, user_cli
from tests.hostile.conftest import clean_failure


def _cli(cwd: Path, *args: str, pythonpath: str = "") -> subprocess.CompletedProcess[str]:
    return user_cli(cwd, *args, pythonpath=pythonpath)


def _fake_dot(folder: Path, marker: Path) -> Path:
    """A ``dot`` that would betray being run (the attack of hydra.job.env_set.PATH)."""
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    dot = bin_dir / "dot"
    dot.write_text(f"#!/bin/sh\ntouch {marker}\n")
    dot.chmod(dot.stat().st_mode | stat.S_IEXEC)
    return bin_dir


@pytest.mark.parametrize("variable", ["PATH", "LD_PRELOAD", "HOME", "CXX", "TE_ASSEMBLY_MEMORY_LIMIT"])
def test_env_set_from_an_override_is_refused(variable: str, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    bin_dir = _fake_dot(tmp_path, marker)
    done = _cli(tmp_path, "graph", f"+hydra.job.env_set.{variable}={bin_dir}")
    clean_failure(done, 2, f"hydra.job.env_set.{variable}", "never run code nor change the environment")
    assert not marker.exists()
    assert not (tmp_path / "outputs").exists()


def test_env_set_and_env_copy_from_a_primary_config_are_refused(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    bin_dir = _fake_dot(tmp_path, marker)
    (tmp_path / "evil.yaml").write_text(
        "defaults: [config, _self_]\nhydra:\n  job:\n"
        f"    env_set: {{PATH: '{bin_dir}'}}\n    env_copy: [SSH_AUTH_SOCK]\n"
    )
    done = _cli(tmp_path, "graph", "-cd", str(tmp_path), "-cn", "evil")
    clean_failure(done, 2, "hydra.job.env_set.PATH", "hydra.job.env_copy[0]")
    assert not marker.exists()


@pytest.fixture
def betraying_package(tmp_path: Path) -> tuple[Path, Path]:
    """An installed-looking package that writes a marker when imported."""
    site = tmp_path / "site"
    package = site / "betrays"
    package.mkdir(parents=True)
    marker = tmp_path / "imported"
    (package / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('imported')\n")
    (package / "model").mkdir()
    shutil.copy(REPO_ROOT / "configs" / "model" / "residual_mlp.yaml", package / "model" / "evil.yaml")
    return site, marker


def test_a_pkg_search_path_from_an_override_is_refused_before_any_import(
    betraying_package: tuple[Path, Path], tmp_path: Path
) -> None:
    site, marker = betraying_package
    done = _cli(tmp_path, "validate", "hydra.searchpath=[pkg://betrays]", "model=evil", pythonpath=str(site))
    clean_failure(done, 2, "hydra.searchpath[0]", "pkg://betrays")
    assert not marker.exists()


def test_a_pkg_search_path_from_a_primary_config_is_refused_before_any_import(
    betraying_package: tuple[Path, Path], tmp_path: Path
) -> None:
    site, marker = betraying_package
    (tmp_path / "evil.yaml").write_text("defaults: [config, _self_]\nhydra:\n  searchpath: [pkg://betrays]\n")
    done = _cli(tmp_path, "validate", "-cd", str(tmp_path), "-cn", "evil", pythonpath=str(site))
    clean_failure(done, 2, "hydra.searchpath[0]")
    assert not marker.exists()


def test_a_folder_search_path_still_works(tmp_path: Path) -> None:
    (tmp_path / "mine" / "model").mkdir(parents=True)
    shutil.copy(
        REPO_ROOT / "configs" / "model" / "residual_mlp.yaml", tmp_path / "mine" / "model" / "ok.yaml"
    )
    done = _cli(tmp_path, "validate", f"hydra.searchpath=[file://{tmp_path / 'mine'}]", "model=ok")
    assert done.returncode == 0, done.stderr


def test_remote_code_is_never_carried_into_what_te_assembly_writes(hf_llama: Path, tmp_path: Path) -> None:
    source = tmp_path / "hf"
    shutil.copytree(hf_llama, source)
    config = json.loads((source / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "evil_modeling.EvilForCausalLM"}
    (source / "config.json").write_text(json.dumps(config))
    (source / "tokenizer_config.json").write_text(
        json.dumps({"auto_map": {"AutoTokenizer": ["evil_tok.EvilTokenizer", None]}, "model_max_length": 64})
    )
    imported = te_assembly.import_hf(source, tmp_path / "imported")
    exported = __import__("te_assembly.formats.hf.convert").formats.hf.convert.export_hf(
        imported, tmp_path / "out"
    )
    for folder, name in [
        (imported, "hf_config.json"),
        (imported, "tokenizer_config.json"),
        (exported, "config.json"),
        (exported, "tokenizer_config.json"),
    ]:
        text = (folder / name).read_text()
        assert "auto_map" not in text and "evil" not in text, (folder, name)
    assert json.loads((exported / "tokenizer_config.json").read_text())["model_max_length"] == 64


HIDDEN_IN_INTERPOLATIONS = {
    # what Hydra would build or act on, written as one interpolation that builds the node from text
    "callbacks built by oc.create": (
        "hydra:\n  callbacks: "
        "'${oc.create:{w: {_target_: pathlib.Path.write_text, self: VICTIM, data: x}}}'\n",
        "hydra.callbacks",
    ),
    "callbacks interpolated from the config": (
        "evil: {w: {_target_: builtins.print}}\nhydra:\n  callbacks: ${evil}\n",
        "hydra.callbacks",
    ),
    "env_set built by oc.create": (
        "hydra:\n  job:\n    env_set: '${oc.create:{PATH: BIN}}'\n",
        "hydra.job.env_set",
    ),
    "env_set decoded from text": (
        "hydra:\n  job:\n    env_set: \"${oc.decode:'{PATH: BIN}'}\"\n",
        "hydra.job.env_set",
    ),
    "a file handler built by oc.create": (
        "hydra:\n  job_logging: '${oc.create:{version: 1, handlers: {f: {class: logging.FileHandler, "
        "filename: VICTIM, mode: w}}, root: {handlers: [f]}}}'\n",
        "hydra.job_logging",
    ),
    "the run directory's log file named out of it": (
        "name: ../../victim\nhydra:\n  job_logging:\n    version: 1\n    handlers:\n"
        "      f: {class: logging.FileHandler, filename: '${hydra.runtime.output_dir}/${name}.log'}\n"
        "    root: {handlers: [f]}\n",
        "hydra.job_logging.handlers.f.class",
    ),
    "the job's name as a path": ("hydra:\n  job:\n    name: ../../victim\n", "hydra.job.name"),
    "a search path interpolated to pkg://": (
        "where: pkg://betrays\nhydra:\n  searchpath: ['${where}']\n",
        "hydra.searchpath[0]",
    ),
}


@pytest.mark.parametrize("attack", HIDDEN_IN_INTERPOLATIONS, ids=list(HIDDEN_IN_INTERPOLATIONS))
def test_what_hydra_acts_on_is_checked_after_interpolation_too(attack: str, tmp_path: Path) -> None:
    """Each attack of a primary config on a command that writes files (so Hydra's logging is live):
    refused with its key path, and nothing was run, written or emptied."""
    marker = tmp_path / "ran"
    bin_dir = _fake_dot(tmp_path, marker)
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's file")
    text, path = HIDDEN_IN_INTERPOLATIONS[attack]
    text = text.replace("VICTIM", str(victim)).replace("BIN", str(bin_dir))
    (tmp_path / "evil.yaml").write_text("defaults: [config, _self_]\n" + text)
    before = sorted(p.name for p in tmp_path.iterdir())
    done = _cli(tmp_path, "graph", "model=residual_mlp", "-cd", str(tmp_path), "-cn", "evil")
    clean_failure(done, 2, f"error: {path}")
    assert victim.read_text() == "the user's file"
    assert not marker.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no log, no run directory, no file


def test_a_search_path_override_that_interpolates_is_refused_before_any_import(
    betraying_package: tuple[Path, Path], tmp_path: Path
) -> None:
    site, marker = betraying_package
    done = user_cli(
        tmp_path,
        "validate",
        "hydra.searchpath=[${oc.env:WHERE}]",
        "model=evil",
        pythonpath=str(site),
        env={"WHERE": "pkg://betrays"},
    )
    clean_failure(done, 2, "hydra.searchpath[0]", "interpolation")
    assert not marker.exists()


def test_hydra_s_own_log_file_and_a_plain_job_name_still_work(tmp_path: Path) -> None:
    done = _cli(
        tmp_path,
        "train",
        "model=residual_mlp",
        "train.steps=1",
        "hydra/job_logging=default",
        "hydra.job.name=mine",
    )
    assert done.returncode == 0, done.stderr
    assert list(tmp_path.glob("outputs/residual_mlp/*/mine.log"))
