"""The one guarded directory writer: every command that writes a directory as a whole (``export`` in
both formats, ``import-hf``, ``save_pretrained``, ``to_hf``) goes through ``write_directory``, and
``train`` checks its run directory with ``check_run_directory``.

DEST is refused, before any work, when it

- is, contains or is inside a source the command reads (``export pre pre``, ``export run outputs``,
  ``import-hf hf hf/te``), or holds the folder the command runs in;
- holds a training run (its lock, a checkpoint of any kind, its metrics): never replaced;
- is not empty, unless ``overwrite``; and even then, unless it is a directory te_assembly itself wrote as
  the same kind, holding nothing but what it wrote (its manifest, ``MANIFEST``, lists every file). A
  pretrained directory written before manifests is recognised by its layout.

The new directory is written whole into a hidden staging folder beside DEST, which then takes DEST's
place: atomically where the system can exchange two directories (Linux ``renameat2``), otherwise by two
renames, the old copy kept as ``.<name>.<token>.old`` until the new one is in place. A crash between
those two renames leaves DEST absent and the old copy whole: the next command that writes or reads DEST
puts it back and says so (``recover``). So a crash at any instant leaves the old or the new directory.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import logging
import os
import secrets
import shutil
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from te_assembly.errors import OutputPathError
from te_assembly.files.names import overlap
from te_assembly.files.ownership import CONFIG_HEADER, run_evidence
from te_assembly.files.read import LIMITS, InputFileError, read_json
from te_assembly.files.write import fsync_dir, prepare_out_dir, write_text_atomic
from te_assembly.version import __version__

log = logging.getLogger(__name__)

MANIFEST = ".te_assembly.json"
"""Written last into every directory ``write_directory`` makes: its kind and every file in it."""
STAGING = ".saving"
OLD = ".old"


@dataclass(frozen=True)
class Kind:
    """A kind of directory te_assembly writes whole."""

    name: str
    """``pretrained``, ``hf``: recorded in the manifest."""
    what: str
    """In words, for messages: ``a pretrained model directory``."""
    legacy: Callable[[Path, list[str]], bool] | None = None
    """Recognises one written before manifests, from its path and its files (relative paths)."""


def _legacy_pretrained(folder: Path, files: list[str]) -> bool:
    """A pretrained directory as ``save_pretrained``, ``export`` and ``import-hf`` wrote them before
    manifests: their files only, and a ``config.yaml`` with te_assembly's header."""
    known = {"model.safetensors", "config.yaml", "tokenizer.json", "hf_config.json"}
    ours = all(f in known or (f.split("/")[0] in ("model", "block") and f.endswith(".yaml")) for f in files)
    if not ours or "model.safetensors" not in files:
        return False
    try:
        with open(folder / "config.yaml", encoding="utf-8", errors="replace") as f:
            return f.read(len(CONFIG_HEADER)) == CONFIG_HEADER
    except OSError:
        return False


PRETRAINED = Kind("pretrained", "a pretrained model directory", _legacy_pretrained)
HF = Kind("hf", "a Hugging Face checkpoint te_assembly exported")
PEFT = Kind("peft", "a PEFT adapter directory te_assembly exported")


def listed_files(folder: Path) -> list[str]:
    """Every file and link below ``folder`` (relative, ``/``-separated, sorted); symlinked folders are
    listed, not followed."""
    out = []
    for root, dirs, files in os.walk(folder, followlinks=False):
        rel = Path(root).relative_to(folder)
        for name in files + [d for d in dirs if (Path(root) / d).is_symlink()]:
            out.append((rel / name).as_posix())
    return sorted(out)


def manifest_kind(folder: Path) -> tuple[str | None, list[str]]:
    """The kind a directory's manifest records and the files it lists (``None, []`` without a readable
    manifest)."""
    path = folder / MANIFEST
    if not path.is_file():
        return None, []
    try:
        data = read_json(path, limit=LIMITS["metadata"], within=folder)
    except InputFileError:
        return None, []
    if not isinstance(data, dict) or not isinstance(data.get("files"), list):
        return None, []
    kind = data.get("kind")
    return (kind if isinstance(kind, str) else None), [str(f) for f in data["files"]]


def _what_is_there(folder: Path, kind: Kind) -> tuple[str | None, list[str]]:
    """The kind of te_assembly directory ``folder`` is (None: not one) and the files in it that are not
    that kind's (someone else's)."""
    files = [f for f in listed_files(folder) if f != MANIFEST]
    recorded, listed = manifest_kind(folder)
    if recorded is not None:
        return recorded, sorted(set(files) - set(listed))
    for known in (PRETRAINED, HF, PEFT):
        if known.legacy is not None and known.legacy(folder, files):
            return known.name, []
    return None, files


def _refuse(out: Path, why: str, advice: str = "choose another directory") -> OutputPathError:
    return OutputPathError(f"refusing to write {out}: {why}; {advice}")


def check_destination(
    dest: str | os.PathLike[str],
    kind: Kind,
    *,
    overwrite: bool = False,
    sources: Iterable[str | os.PathLike[str]] = (),
) -> Path:
    """DEST, checked as the module docstring says (``OutputPathError`` naming what is in the way) and its
    parent made; call it before the work, so nothing is done that cannot be written."""
    out = Path(dest).expanduser()
    recover(out)
    evidence = run_evidence(out)
    if evidence:
        raise _refuse(out, f"it holds a training run ({', '.join(evidence[:4])}), which nothing replaces")
    _check_overlaps(out, sources)
    if overlap(out, Path.cwd()) in ("is", "contains"):  # replacing it would pull the folder from under us
        raise _refuse(out, f"it holds the folder this command runs in ({Path.cwd()})")
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise _refuse(out, "it exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        found, foreign = _what_is_there(out, kind)
        if not overwrite:
            raise _refuse(
                out,
                "it is not empty",
                "choose an empty or new directory, or replace a directory te_assembly wrote with "
                "overwrite (export.overwrite=true, import_hf.overwrite=true, overwrite=True)",
            )
        if found is None:
            shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
            raise _refuse(
                out,
                f"overwrite replaces only a directory te_assembly wrote, and this one holds files it did "
                f"not write ({shown})",
            )
        if found != kind.name:
            raise _refuse(out, f"it is a te_assembly {found} directory, not {kind.what}")
        if foreign:
            shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
            raise _refuse(
                out,
                f"it holds files te_assembly did not write ({shown}), which an overwrite would delete",
                "move them out first, or choose another directory",
            )
    prepare_out_dir(out.parent if out.parent != Path("") else Path("."))
    return out


def _check_overlaps(
    out: Path,
    sources: Iterable[str | os.PathLike[str]],
    refused: tuple[str, ...] = ("is", "contains", "inside"),
) -> None:
    words = {"is": "it is", "contains": "it contains", "inside": "it is inside"}
    for source in sources:
        relation = overlap(out, source)
        if relation in refused:
            raise _refuse(out, f"{words[relation]} the source, {source}")


def check_run_directory(
    out_dir: str | os.PathLike[str], sources: Iterable[str | os.PathLike[str]] = ()
) -> None:
    """``OutputPathError`` when a training run's directory is, or is inside, a source the run reads (its
    ``init_from`` model, its data, its tokenizer: a run's files there would be read back as data), or is
    a directory te_assembly wrote whole (a pretrained model, an export). A run writes file by file and
    an overwrite removes only the run's own files, so other files in it are left alone."""
    out = Path(out_dir).expanduser()
    _check_overlaps(out, sources, ("is", "inside"))
    if out.is_dir() and not run_evidence(out):
        found, _ = _what_is_there(out, PRETRAINED)
        if found is not None:
            raise _refuse(out, f"it is a te_assembly {found} directory, and a run never writes into one")


def write_directory(
    dest: str | os.PathLike[str],
    kind: Kind,
    fill: Callable[[Path], None],
    *,
    overwrite: bool = False,
    sources: Sequence[str | os.PathLike[str]] = (),
) -> Path:
    """Make DEST whole or not at all (module docstring): ``fill`` writes the directory into a staging
    folder beside DEST; the manifest is added and the staging folder takes DEST's place."""
    out = check_destination(dest, kind, overwrite=overwrite, sources=sources)
    staging = _staging(out)
    try:
        fill(staging)
        _write_manifest(staging, kind)
        _swap_into(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out


def _write_manifest(staging: Path, kind: Kind) -> None:
    record = {
        "written_by": f"te_assembly {__version__}",
        "kind": kind.name,
        "files": [f for f in listed_files(staging) if f != MANIFEST],
    }
    write_text_atomic(staging / MANIFEST, json.dumps(record, indent=1) + "\n")


def _hidden(out: Path, suffix: str) -> list[Path]:
    with contextlib.suppress(OSError):
        return sorted(out.parent.glob(f".{glob_escape(out.name)}.*{suffix}"))
    return []


def glob_escape(name: str) -> str:
    """``name`` with glob's special characters taken literally."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


def _staging(out: Path) -> Path:
    """A new hidden folder beside ``out`` to write the whole directory into; stale ones a killed write
    left behind are removed first."""
    for stale in _hidden(out, STAGING):
        shutil.rmtree(stale, ignore_errors=True)
    for _ in range(100):
        candidate = out.parent / f".{out.name}.{secrets.token_hex(4)}{STAGING}"
        try:
            candidate.mkdir(0o777)  # the umask applies, as for any directory of the user
            return candidate
        except FileExistsError:
            continue
    raise OutputPathError(f"cannot create a staging directory next to {out}")


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _exchange(a: Path, b: Path) -> bool:
    """Swap directories ``a`` and ``b`` in one step (Linux ``renameat2(RENAME_EXCHANGE)``); False where
    the system or the file system cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def _swap_into(staging: Path, out: Path) -> None:
    """Put the complete ``staging`` folder where ``out`` is (module docstring)."""
    try:
        if out.is_dir() and not any(out.iterdir()):
            out.rmdir()
        if not out.exists():
            os.rename(staging, out)
        elif _exchange(staging, out):
            shutil.rmtree(staging, ignore_errors=True)  # now the old directory
        else:
            old = out.parent / f".{out.name}.{secrets.token_hex(4)}{OLD}"
            os.rename(out, old)
            os.rename(staging, out)
            shutil.rmtree(old, ignore_errors=True)
    except OSError as exc:
        raise OutputPathError(f"cannot put {out} in place: {exc.strerror or exc}") from None
    fsync_dir(out.parent)


def recover(out: Path) -> str | None:
    """Put back a directory an interrupted overwrite left as ``.<name>.<token>.old`` (DEST absent), or
    remove such copies once DEST is whole again; returns (and logs) what was done, if anything."""
    olds = _hidden(out, OLD)
    if not olds:
        return None
    if out.exists() or out.is_symlink():
        for old in olds:
            shutil.rmtree(old, ignore_errors=True)
        return None
    newest = max(olds, key=lambda p: p.stat().st_mtime)
    try:
        os.rename(newest, out)
    except OSError as exc:
        raise OutputPathError(
            f"{out} is missing and an earlier overwrite left its old copy in {newest}, which cannot be "
            f"put back: {exc.strerror or exc}; rename it to {out.name} yourself"
        ) from None
    message = (
        f"{out} was missing: an earlier overwrite was interrupted before the new copy took its place; the "
        f"old copy ({newest.name}) is back in place"
    )
    log.warning(message)
    return message


__all__ = [
    "HF",
    "MANIFEST",
    "PEFT",
    "PRETRAINED",
    "Kind",
    "check_destination",
    "check_run_directory",
    "listed_files",
    "manifest_kind",
    "recover",
    "write_directory",
]
