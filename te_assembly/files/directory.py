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

One writer at a time: a writer holds ``.<name>.lock`` beside DEST from its staging folder's creation
to the swap (and removes it after), and a second one is refused while it does. DEST is checked again
just before the swap, so a DEST that changed while the work ran (a folder made there, files added) is
left as it is and the write refused. Clean-up removes only folders this writer made: a staging folder
holding its marker (``STAGING_MARK``), an old copy holding nothing but what its manifest lists; a
user's own ``.<name>.x.old`` is never touched.
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
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from te_assembly.errors import OutputPathError
from te_assembly.files.names import overlap
from te_assembly.files.ownership import CONFIG_HEADER, run_evidence
from te_assembly.files.read import LIMITS, InputFileError, read_json
from te_assembly.files.write import fsync_dir, prepare_out_dir, write_text_atomic
from te_assembly.version import __version__

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: concurrent writers are not kept apart
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

MANIFEST = ".te_assembly.json"
"""Written last into every directory ``write_directory`` makes: its kind and every file in it."""
STAGING = ".saving"
OLD = ".old"
STAGING_MARK = ".te_assembly.staging"
"""Written first into a staging folder (and removed before the swap): the folder is this writer's."""
LOCK = ".lock"


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
    with _locked(out):
        staging = _staging(out)
        try:
            fill(staging)
            (staging / STAGING_MARK).unlink()  # from here its manifest says it is this writer's
            _write_manifest(staging, kind)
            # Again, under the lock: DEST may have been made, filled or changed while the work ran.
            check_destination(out, kind, overwrite=overwrite, sources=sources)
            _swap_into(staging, out)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return out


def _lock_path(out: Path) -> Path:
    return out.parent / f".{out.name}{LOCK}"


def _take_lock(out: Path) -> int | None:
    """An fd holding DEST's lock, or None when another process holds it. The lock file is removed by the
    holder when done; a lock taken on a file removed meanwhile is no lock, so the path is checked to be
    the locked file still."""
    path = _lock_path(out)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    if fcntl is None:
        return fd
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.stat(path).st_ino == os.fstat(fd).st_ino:
            return fd
    except (BlockingIOError, FileNotFoundError):
        pass
    os.close(fd)
    return None


def _release(out: Path, fd: int) -> None:
    with contextlib.suppress(OSError):
        os.unlink(_lock_path(out))  # still held: no other process can take this file meanwhile
    os.close(fd)


@contextlib.contextmanager
def _locked(out: Path) -> Iterator[None]:
    """Hold DEST's lock (module docstring); ``OutputPathError`` when another writer holds it."""
    try:
        fd = _take_lock(out)
    except OSError as exc:
        raise OutputPathError(f"cannot write {out}: {exc.strerror or exc}") from None
    if fd is None:
        raise _refuse(
            out,
            "another te_assembly command is writing it right now",
            "wait for that command to finish, or choose another directory",
        )
    try:
        yield
    finally:
        _release(out, fd)


@contextlib.contextmanager
def _quietly_locked(out: Path) -> Iterator[bool]:
    """DEST's lock if it can be had at once (True), else nothing (False: a writer is at work, or the
    folder cannot hold a lock file, as a read-only one)."""
    try:
        fd = _take_lock(out)
    except OSError:
        fd = None
    if fd is None:
        yield False
        return
    try:
        yield True
    finally:
        _release(out, fd)


def _write_manifest(staging: Path, kind: Kind) -> None:
    record = {
        "written_by": f"te_assembly {__version__}",
        "kind": kind.name,
        "files": [f for f in listed_files(staging) if f != MANIFEST],
    }
    write_text_atomic(staging / MANIFEST, json.dumps(record, indent=1) + "\n")


def _hidden(out: Path, suffix: str) -> list[Path]:
    """The staging folders (``suffix`` STAGING) or old copies (OLD) this writer made beside ``out``:
    named as it names them, and holding its marker, or nothing but what their manifest lists."""
    found = []
    with contextlib.suppress(OSError):
        for path in out.parent.glob(f".{glob_escape(out.name)}.*{suffix}"):
            token = path.name[len(out.name) + 2 : -len(suffix)]
            if len(token) == 8 and all(c in "0123456789abcdef" for c in token) and _made_here(path, suffix):
                found.append(path)
    return sorted(found)


def _made_here(folder: Path, suffix: str) -> bool:
    if not folder.is_dir() or folder.is_symlink():
        return False
    if suffix == STAGING and (folder / STAGING_MARK).is_file():
        return True
    recorded, listed = manifest_kind(folder)
    files = listed_files(folder)
    if recorded is None:  # a pretrained directory written before manifests, by its layout
        return PRETRAINED.legacy is not None and PRETRAINED.legacy(folder, files)
    return set(files) <= {*listed, MANIFEST}


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
        except FileExistsError:
            continue
        (candidate / STAGING_MARK).write_text(f"{os.getpid()}\n")
        return candidate
    raise OutputPathError(f"cannot create a staging directory next to {out}")


_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2


def _renameat2(a: Path, b: Path, flag: int) -> bool:
    """Linux ``renameat2(a, b, flag)``; False where the system or the file system cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), flag) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def _exchange(a: Path, b: Path) -> bool:
    """Swap directories ``a`` and ``b`` in one step (``RENAME_EXCHANGE``)."""
    return _renameat2(a, b, _RENAME_EXCHANGE)


def _rename_new(a: Path, b: Path) -> None:
    """``a`` renamed to ``b``, which must not exist (``RENAME_NOREPLACE``: a plain rename would put it
    over an empty folder made there meanwhile)."""
    if not _renameat2(a, b, _RENAME_NOREPLACE):
        os.rename(a, b)


def _swap_into(staging: Path, out: Path) -> None:
    """Put the complete ``staging`` folder where ``out`` is (module docstring)."""
    try:
        if out.is_dir() and not any(out.iterdir()):
            out.rmdir()
        if not out.exists():
            _rename_new(staging, out)
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
    if not _hidden(out, OLD):
        return None
    with _quietly_locked(out) as locked:
        if not locked:  # a writer is between its two renames, or nothing here can change
            return None
        return _recover(out)


def _recover(out: Path) -> str | None:
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
