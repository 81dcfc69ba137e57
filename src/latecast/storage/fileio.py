"""Crash-safe writes: a file or a folder is built next to its target, fsynced and renamed over
it, so a writer killed at any point (even ``kill -9``) leaves the previous one; the next write
of the same target removes what dead writers left behind."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

from ..errors import ConfigError, WriteError


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """Yield a temp file next to ``path``; on success fsync it and ``os.replace`` it onto ``path``.
    An exception (or a crash) leaves ``path`` as it was: the previous file, or nothing."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    owner = f"{socket.gethostname()}-{os.getpid()}"  # whose temp file: see _clean_temps
    _clean_temps(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{owner}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)  # mkstemp's 0600 would make shared caches unreadable to others
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_folder(out: Path, check: Callable[[Path], None]) -> Iterator[Path]:
    """Yield an empty temporary sibling ``.out.tmp-PID``; on success fsync it and rename it to
    ``out``. ``check(out)``, run once dead writers' leftovers are cleaned, raises to keep
    ``out``. Any ``OSError`` (a full disk, a read-only folder, a name too long) becomes one
    ``WriteError`` naming ``out``, after the temporary folder is removed."""
    out = out.resolve()
    if out == Path.cwd() or out in Path.cwd().parents:
        raise ConfigError(
            f"{out} is the current folder or holds it; refusing to write a store "
            f"over it: choose a new folder"
        )
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        _clean_leftovers(out)
        check(out)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        yield tmp
        for p in sorted(tmp.rglob("*"), reverse=True) + [tmp]:  # files before their folder
            _fsync(p)
        _publish(tmp, out)
    except OSError as e:
        raise cannot_write(out, e) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def cannot_write(out: Path, e: OSError) -> WriteError:
    """One line for an OSError writing the store ``out``: a full disk, a name too long, ..."""
    return WriteError(f"{out}: cannot write the store there: {e.strerror or e}")


def _alive(pid: int) -> bool:
    if os.name != "posix":  # os.kill(pid, 0) would terminate the process on Windows
        return False
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
        return True
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True


def _clean_temps(path: Path) -> None:
    """Remove the ``.NAME.HOST-PID.XXXXXXXX.tmp`` files of ``path`` that dead writers on this
    host left (a live writer's, or another host's, stay)."""
    prefix, host = f".{path.name}.", socket.gethostname()
    for p in path.parent.iterdir():
        if not (p.name.startswith(prefix) and p.name.endswith(".tmp")):
            continue
        owner = p.name[len(prefix) : -len(".tmp")].rpartition(".")[0]
        name, _, pid = owner.rpartition("-")
        if name == host and pid.isdigit() and not _alive(int(pid)):
            p.unlink(missing_ok=True)


def _clean_leftovers(out: Path) -> None:
    """Remove ``.out.tmp-PID`` / ``.out.old-PID`` of dead writers; restore an old folder a
    crash left renamed away (the instant between the two renames of ``_publish``)."""
    prefix = f".{out.name}."
    for p in sorted(p for p in out.parent.iterdir() if p.name.startswith(prefix)):
        kind, _, pid = p.name[len(prefix) :].partition("-")
        if kind not in ("tmp", "old") or not pid.isdigit() or _alive(int(pid)):
            continue
        if kind == "old" and not out.exists():
            os.replace(p, out)
        else:
            shutil.rmtree(p, ignore_errors=True)


def _fsync(path: Path) -> None:
    if path.is_file() or os.name == "posix":  # folders can be fsynced on POSIX only
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _publish(tmp: Path, out: Path) -> None:
    old = out.parent / f".{out.name}.old-{os.getpid()}"
    if out.exists():
        os.replace(out, old)  # a directory rename is atomic; a crash here is undone next run
    try:
        os.replace(tmp, out)
    except OSError:
        if old.exists():
            os.replace(old, out)
        raise
    _fsync(out.parent)  # make the renames themselves durable
    shutil.rmtree(old, ignore_errors=True)


def cache_dir() -> Path:
    """latecast's cache folder: ``$LATECAST_CACHE``, default ``~/.cache/latecast``."""
    folder = os.environ.get("LATECAST_CACHE") or Path.home() / ".cache" / "latecast"
    return Path(folder).expanduser()
