"""A training run's output folder (``--output-dir``):
``check_path`` (writable, nothing written), ``write`` (JSON files replaced whole), ``claim``
(one run at a time: ``fcntl.flock`` on ``OUT/.latecast.lock``). A previous run (``RUN_FILES``)
is continued (``--resume``) or replaced (``--overwrite``): only files latecast verifiably
wrote, kept aside until the new run's first checkpoint, put back if it fails (``settle``)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from pathlib import Path
from typing import Callable, Iterator

from ..errors import ConfigError, WriteError
from ..storage.fileio import atomic_write
from . import stops
from .checkpoint import is_checkpoint

try:
    import fcntl
except ImportError:  # Windows: no flock, runs are not locked there
    fcntl = None

RUN_FILES = ("config.json", "metrics.jsonl", "summary.json", "checkpoint.pt", "best.pt")
LOCK = ".latecast.lock"
ASIDE = ".latecast-replaced"  # the previous run's files until --overwrite's run checkpoints
MOVING = ".latecast-replacing"  # ASIDE while they are being moved into it
_HOLDER = "latecast run: "  # the lock file's first bytes: it is ours to rewrite
_KEYS = {  # what a file latecast wrote holds, per JSON name
    "config.json": {"dataset", "model", "world_size"},
    "summary.json": {"test_accuracy", "h2d_bytes"},
    "metrics.jsonl": {"epoch", "step", "test_accuracy"},
}


def check_path(out: str) -> Path:
    """``out`` as a Path once a run can create and write it, else ``ConfigError``; no writes."""
    if not out:
        raise ConfigError("output_dir is empty: name a folder")
    path = Path(out)
    existing = next(p for p in (path, *path.parents) if os.path.lexists(p))
    if not existing.is_dir():
        where = "is" if existing == path else f"would be under {existing}, which is"
        raise ConfigError(f"output folder {out} {where} not a folder")
    limit = os.pathconf(existing, "PC_NAME_MAX")
    long = [p for p in path.relative_to(existing).parts if len(os.fsencode(p)) > limit]
    if long or len(os.fsencode(str(path.absolute()))) >= os.pathconf(existing, "PC_PATH_MAX"):
        name = f"{long[0][:40]}... is over {limit} bytes" if long else "the path is too long"
        raise ConfigError(f"output folder {out:.80}: name too long ({name})")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(
            f"output folder {out}: {existing} is not writable (read-only or no permission)"
        )
    return path


def check(out: str, resume: str | None, overwrite: bool) -> list[str]:
    """What ``claim`` would find, without writing: the previous run's files that
    ``overwrite`` would replace; ``ConfigError`` when a run could not start there now."""
    path = check_path(out)
    with contextlib.suppress(OSError):
        fd = os.open(path / LOCK, os.O_RDONLY)
        try:
            _lock(fd, path, fcntl.LOCK_SH if fcntl else 0)  # conflicts with a holder's LOCK_EX
        finally:
            os.close(fd)
    left = [path / d for d in (MOVING, ASIDE) if (path / d).is_dir()]
    if left:  # settling moves files: a real run does it (claim)
        raise ConfigError(
            f"output folder {out}: an --overwrite run was stopped before it settled "
            f"{left[0]}; run latecast train without --check to settle it first"
        )
    return _previous(path, resume, overwrite)


@contextlib.contextmanager
def claim(out: str, resume: str | None, overwrite: bool) -> Iterator[Callable[[], None]]:
    """Hold ``out`` for one run. The previous run's files that ``overwrite`` allows
    replacing (judged under the lock, so two runs cannot both find the folder free) are
    moved aside; yields ``kept``, to call after each save of ``checkpoint.pt``: the first
    removes them. If the block ends before that (an error, Ctrl-C), they are put back."""
    with _held(out) as path:
        settle(path)  # what a killed run left
        replaced = _previous(path, resume, overwrite)
        try:
            if replaced:
                (path / MOVING).mkdir()
                for name in replaced:
                    os.replace(path / name, path / MOVING / name)
                (path / MOVING).rename(path / ASIDE)  # all aside: what comes is the new run's
                stops.at("aside")
            yield lambda: settle(path)
        finally:
            settle(path)


def settle(out: Path) -> None:
    """One run from two. Stopped while moving the previous run's files aside: they are put
    back (the new run has written nothing yet). All aside: the new run's ``checkpoint.pt``
    decides. It has one: the files aside are removed. It has none: they are put back over
    what the new run wrote (its files without a counterpart removed when verifiably ours)."""
    if (out / MOVING).is_dir():
        _put_back(out / MOVING, out)
    aside = out / ASIDE
    if not aside.is_dir():
        return
    if os.path.lexists(out / "checkpoint.pt"):
        for name in RUN_FILES:
            (aside / name).unlink(missing_ok=True)
        aside.rmdir()
        return
    for name in RUN_FILES:
        new = out / name
        if not os.path.lexists(aside / name) and os.path.lexists(new) and _ours(new):
            new.unlink()
    _put_back(aside, out)


def _put_back(folder: Path, out: Path) -> None:
    for name in RUN_FILES:
        if os.path.lexists(folder / name):
            os.replace(folder / name, out / name)
    folder.rmdir()


@contextlib.contextmanager
def _held(out: str) -> Iterator[Path]:
    """``out`` created and its lock taken (naming this process) for the block; folders it
    created are removed after it when they hold nothing but the lock file."""
    path = check_path(out)
    made = [p for p in (path, *path.parents) if not os.path.lexists(p)]  # leaf first
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd = os.open(path / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:
        raise ConfigError(f"output folder {out}: {err.strerror or err}") from None
    try:
        _lock(fd, path, fcntl.LOCK_EX if fcntl else 0)
        if os.fstat(fd).st_nlink == 0:  # removed by a run that stopped as this one opened it
            raise ConfigError(f"output folder {out}: another latecast run just left it; retry")
        held = _read(fd)
        if held and not held.startswith(_HOLDER):
            raise ConfigError(f"{path / LOCK} was not written by latecast; move it away")
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        holder = f"{_HOLDER}pid {os.getpid()} on {socket.gethostname()}, started {stamp}\n"
        os.write(fd, holder.encode())
        try:
            yield path
        finally:  # (under the lock: no other run is writing in the folder)
            with contextlib.suppress(OSError):
                if made and os.listdir(path) == [LOCK]:
                    os.unlink(path / LOCK)
                    for p in made:
                        p.rmdir()
    finally:
        os.close(fd)  # releases the lock


def write(out: str, name: str, value: dict | list[dict]) -> None:
    """``OUT/name`` written whole or not at all: a JSON object, indented, or for ``.jsonl`` one
    JSON row a line; a failed write is a ``WriteError`` naming the file."""
    path = Path(out) / name
    rows = name.endswith(".jsonl")
    text = "".join(json.dumps(r) + "\n" for r in value) if rows else json.dumps(value, indent=2)
    try:
        with atomic_write(path) as f:
            f.write(text.encode())
    except OSError as err:
        raise WriteError(f"{path}: not written ({err.strerror or err})") from None


def _read(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    return os.read(fd, 4096).decode(errors="replace")


def _lock(fd: int, path: Path, mode: int) -> None:
    """Take ``mode`` on ``fd`` or raise naming the run that holds it (``LOCK_SH``: a probe)."""
    if not fcntl:
        return
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
    except BlockingIOError:
        held = _read(fd).strip()
        raise ConfigError(
            f"output folder {path} is in use by another latecast run "
            f"({held[len(_HOLDER) :] or 'starting'}); wait for it or choose another --output-dir"
        ) from None
    if mode == fcntl.LOCK_SH:
        fcntl.flock(fd, fcntl.LOCK_UN)


def _previous(out: Path, resume: str | None, overwrite: bool) -> list[str]:
    """The previous run's files in ``out`` a new run may replace; refuses when not asked."""
    found = [name for name in RUN_FILES if os.path.lexists(out / name)]
    if not found:
        return []
    if overwrite:
        foreign = [name for name in found if not _ours(out / name)]
        if foreign:
            raise ConfigError(
                f"{out / foreign[0]} was not written by latecast; --overwrite replaces only "
                f"a previous run's own files: move it away or choose another --output-dir"
            )
        return found
    if resume == "auto" or (resume and Path(resume).resolve().parent == out.resolve()):
        return []  # this folder's own run continues (or restarts: it never checkpointed)
    if resume:
        raise ConfigError(
            f"output folder {out} holds another run ({', '.join(found)}); continuing "
            f"{resume} there would replace it: choose another --output-dir"
        )
    raise ConfigError(
        f"output folder {out} holds a previous run ({', '.join(found)}); continue it with "
        f"--resume auto, replace it with --overwrite, or choose another --output-dir"
    )


def _ours(path: Path) -> bool:
    """Whether ``path``, named like one of ``RUN_FILES``, is verifiably what latecast wrote."""
    if path.is_symlink() or not path.is_file():
        return False
    if path.suffix == ".pt":
        return is_checkpoint(path)
    try:
        text = path.read_text()
        rows = [json.loads(x) for x in (text.splitlines() if path.suffix == ".jsonl" else [text])]
    except (OSError, ValueError):
        return False
    return all(isinstance(row, dict) and _KEYS[path.name] <= row.keys() for row in rows)
