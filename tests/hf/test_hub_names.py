"""``import-hf ORG/NAME[@REVISION]`` and ``verify hf=ORG/NAME`` through huggingface_hub, offline
(``HF_HUB_OFFLINE=1``) on a cache laid out as huggingface_hub writes it: ``refs/``, ``snapshots/`` whose
files are links into ``blobs/``. A name found in the cache imports as its folder would; a name not there,
offline, is one clean error that says what to do; a folder of that name where the command runs wins."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from tests.conftest import user_cli
from tests.hf.tiny import make

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _cached(cache: Path, repo: str, source: Path, revisions: tuple[str, ...] = ("main",)) -> Path:
    """``source``'s files in ``cache`` as huggingface_hub lays a downloaded repository out."""
    root = cache / f"models--{repo.replace('/', '--')}"
    snapshot = root / "snapshots" / COMMIT
    (root / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for file in sorted(source.iterdir()):
        blob = root / "blobs" / hashlib.sha256(file.read_bytes()).hexdigest()
        blob.write_bytes(file.read_bytes())
        (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
    (root / "refs").mkdir()
    for revision in revisions:
        (root / "refs" / revision).write_text(COMMIT)
    return snapshot


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("hub")
    source = make("llama", root / "made", changes={"vocab_size": 272})
    cache = root / "cache"
    _cached(cache, "tiny-org/tiny-llama", source, ("main", "v1"))
    return {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "HF_HOME": str(root / "home")}


def test_a_hub_name_in_the_cache_imports_as_its_folder_would(hub: dict[str, str], tmp_path: Path) -> None:
    done = user_cli(tmp_path, "import-hf", "tiny-org/tiny-llama", env=hub)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "tiny-llama_te" / "model.safetensors").is_file()
    done = user_cli(tmp_path, "import-hf", "tiny-org/tiny-llama@v1", "pinned", env=hub)
    assert done.returncode == 0, done.stdout + done.stderr
    done = user_cli(tmp_path, "verify", "hf=tiny-org/tiny-llama", "dtype=float64", env=hub)
    assert done.returncode == 0 and "passed" in done.stdout.lower(), done.stdout + done.stderr


@pytest.mark.parametrize("name", ["tiny-org/not-there", "tiny-org/tiny-llama@v9"])
def test_a_name_the_cache_lacks_offline_is_one_clean_error(
    name: str, hub: dict[str, str], tmp_path: Path
) -> None:
    done = user_cli(tmp_path, "import-hf", name, env=hub)
    text = done.stdout + done.stderr
    assert done.returncode == 1 and "Traceback" not in text and "unexpected" not in text, text
    assert "not in the local Hugging Face cache" in text and "HF_HUB_OFFLINE=1" in text, text
    assert not list(tmp_path.glob("*_te"))


def test_a_folder_of_that_name_here_is_read_as_a_folder(hub: dict[str, str], tmp_path: Path) -> None:
    make("llama", tmp_path / "tiny-org" / "tiny-llama", changes={"vocab_size": 272, "num_hidden_layers": 1})
    done = user_cli(tmp_path, "import-hf", "tiny-org/tiny-llama", "local", env=hub)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 layers" in done.stdout


def test_a_link_out_of_the_snapshot_and_its_repository_is_still_refused(
    hub: dict[str, str], tmp_path: Path
) -> None:
    """The cache's own links into blobs/ are followed; one leading anywhere else is not."""
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text('{"secret": "from elsewhere"}')
    snapshot = Path(hub["HF_HUB_CACHE"]) / "models--tiny-org--tiny-llama" / "snapshots" / COMMIT
    copy = tmp_path / "cache"
    shutil.copytree(Path(hub["HF_HUB_CACHE"]), copy, symlinks=True)
    linked = copy / snapshot.relative_to(hub["HF_HUB_CACHE"]) / "generation_config.json"
    linked.unlink()
    linked.symlink_to(elsewhere)
    done = user_cli(tmp_path, "import-hf", "tiny-org/tiny-llama", env={**hub, "HF_HUB_CACHE": str(copy)})
    text = done.stdout + done.stderr
    assert done.returncode == 1 and "outside" in text and "from elsewhere" not in text, text


def _raising(error: Exception):  # type: ignore[no-untyped-def]
    def download(repo_id: str, **kwargs: object) -> str:
        if kwargs.get("local_files_only"):
            from huggingface_hub.errors import LocalEntryNotFoundError

            raise LocalEntryNotFoundError("not cached")
        raise error

    return download


def _hub_errors() -> dict[str, tuple[Exception, str]]:
    import types

    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    answer = types.SimpleNamespace(headers={}, status_code=403, request=None, url="http://localhost/")
    return {
        "gated": (GatedRepoError("gated", response=answer), "is gated: accept its terms"),  # type: ignore[arg-type]
        "missing": (RepositoryNotFoundError("missing", response=answer), "no such repository"),  # type: ignore[arg-type]
        "revision": (RevisionNotFoundError("no rev", response=answer), "has no revision"),  # type: ignore[arg-type]
        "network": (OSError("Name or service not known"), "the Hub cannot be reached"),
    }


@pytest.mark.parametrize("case", ["gated", "missing", "revision", "network"])
def test_what_the_hub_answers_is_one_clean_error_that_says_what_to_do(
    case: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import huggingface_hub

    from te_assembly.errors import CheckpointError
    from te_assembly.formats.hf.hub import hub_folder

    error, words = _hub_errors()[case]
    monkeypatch.setattr(huggingface_hub, "snapshot_download", _raising(error))
    monkeypatch.setattr(huggingface_hub.constants, "is_offline_mode", lambda: False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointError, match=words):
        hub_folder("some-org/some-model@v2")


def test_only_what_an_import_reads_is_asked_for(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No pickled weights, no code: the download names its files by pattern."""
    import fnmatch

    import huggingface_hub

    from te_assembly.formats.hf.hub import IMPORT_FILES, hub_folder

    asked: list[object] = []

    def download(repo_id: str, **kwargs: object) -> str:
        asked.append(kwargs.get("allow_patterns"))
        return str(tmp_path)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", download)
    monkeypatch.chdir(tmp_path)
    assert hub_folder("some-org/some-model") == tmp_path
    (patterns,) = asked
    assert patterns == IMPORT_FILES
    for wanted in (
        "config.json",
        "model-00001-of-00002.safetensors",
        "tokenizer.json",
        "chat_template.jinja",
    ):
        assert any(fnmatch.fnmatch(wanted, p) for p in IMPORT_FILES), wanted
    for unwanted in ("pytorch_model.bin", "modeling_evil.py", "tokenizer.model.pkl", "training_args.bin"):
        assert not any(fnmatch.fnmatch(unwanted, p) for p in IMPORT_FILES), unwanted
