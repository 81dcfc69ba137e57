"""Running anyone's script as ``python [OPTIONS] script ARGS`` would, inside ``latecast
doctor``'s process (``runpy``, as ``__main__``), stopped after ``--steps``; its exit, errors and
warnings its own, and everything put back after."""

from __future__ import annotations

import contextlib
import linecache
import os
import re
import runpy
import sys
import tempfile
import traceback
import warnings
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Iterator

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from ..errors import ConfigError
from ..trainer import group
from .observe import Observer, Stop, is_library, is_script, short_path, watching

WARMUP, PROFILED = 2, 3  # --profile: steps before the profiler starts, steps it records


@dataclass(frozen=True)
class Script:
    """What follows ``--``: a script's path or a module, its arguments, python's options."""

    kind: str  # "path" | "module"
    name: str
    argv: list[str]
    flags: list[tuple[str, str | None]]  # ("u", None), ("W", "ignore"), ...


def target(cfg, command: list[str]) -> Script:
    """The script after ``--``; ``ConfigError`` for one not there, torchrun, or a bad option."""
    cmd = command[1:] if command[:1] == ["--"] else list(command)
    flags: list[tuple[str, str | None]] = []
    if not cfg.module and cmd and re.fullmatch(r"python[\d.]*", Path(cmd[0]).name):
        flags, cmd = python_options(cmd[1:])
    module = cfg.module
    if not module and cmd[:1] == ["-m"] and len(cmd) > 1:
        module, cmd = cmd[1], cmd[2:]
    name = module or (cmd.pop(0) if cmd else "")
    if not name:
        raise ConfigError("name the script to run: latecast doctor -- python train.py [ARGS]")
    if Path(name).name in ("torchrun", "torch.distributed.run", "torch.distributed.launch"):
        raise ConfigError(
            "doctor watches the process it runs in, not torchrun's children: start doctor "
            "under torchrun instead, torchrun [OPTIONS] -m latecast doctor -- train.py"
        )
    if module:
        sys.path.insert(0, os.getcwd())  # as python -m does
        try:
            found = find_spec(module) is not None
        except ImportError:  # its parent package is not there
            found = False
        finally:
            sys.path.pop(0)
        if not found:
            raise ConfigError(f"no module named {module!r} to run")
        return Script("module", module, cmd, flags)
    if not Path(name).is_file():
        raise ConfigError(f"script {name} not found (or not a file)")
    return Script("path", name, cmd, flags)


# python's options that doctor applies for the script's run (-u: its output flushed at each
# line; -W, -B), and those that shape the interpreter as it starts, which hold only where
# doctor itself was started under them (their names in sys.flags)
APPLIED = "uWB"
AT_START = {"O": "optimize", "E": "ignore_environment", "s": "no_user_site", "S": "no_site"}
AT_START |= {"I": "isolated", "P": "safe_path", "b": "bytes_warning", "d": "debug"}
AT_START |= {"v": "verbose", "q": "quiet", "i": "inspect", "R": "hash_randomization"}


def python_options(cmd: list[str]) -> tuple[list[tuple[str, str | None]], list[str]]:
    """The interpreter's options before the script in ``python -u -Wignore -X dev train.py``
    (letters may be joined, ``-uB``; ``-W``/``-X`` take the rest of the word or the next),
    and what follows them; ``-m MODULE`` is left at the front."""
    cmd, flags = list(cmd), []
    while cmd and cmd[0].startswith("-") and cmd[0] not in ("-", "-m"):
        word = cmd.pop(0)
        if word.startswith("--"):
            raise ConfigError(f"python option {word}: doctor takes python's one-letter options")
        for i, letter in enumerate(word[1:], 1):
            if letter in "WXm":  # takes a value: the rest of the word, else the next word
                value = word[i + 1 :] or (cmd.pop(0) if cmd else "")
                if not value:
                    raise ConfigError(f"python -{letter} needs a value")
                if letter == "m":
                    cmd[:0] = ["-m", value]
                else:
                    flags.append((letter, value))
                break
            if letter == "c":
                raise ConfigError("doctor runs a script or a module (-m), not python -c code")
            flags.append((letter, None))
    for letter, value in flags:
        if letter in APPLIED or _in_effect(letter, value):
            continue
        given = f"-{letter}" + (f" {value}" if value else "")
        raise ConfigError(
            f"python {given} shapes the interpreter as it starts, and doctor runs the script in "
            f"its own: start doctor under it, python {given} -m latecast doctor -- SCRIPT"
        )
    return flags, cmd


def _in_effect(letter: str, value: str | None) -> bool:
    """Whether this interpreter was started with ``-LETTER [VALUE]``."""
    if letter == "X":  # -X dev: {"dev": True}; -X int_max_str_digits=9: {"...": "9"}
        key, eq, val = (value or "").partition("=")
        return key in sys._xoptions and sys._xoptions[key] == (val if eq else True)
    return bool(getattr(sys.flags, AT_START.get(letter, ""), False))


@contextlib.contextmanager
def as_python_would(flags: list[tuple[str, str | None]]) -> Iterator[None]:
    """``-u``, ``-W``, ``-B`` applied and warnings shown as Python shows them, put back after."""
    streams = [s for s in (sys.stdout, sys.stderr) if hasattr(s, "reconfigure")]
    saved = sys.dont_write_bytecode, warnings.formatwarning
    buffering = [(s.line_buffering, s.write_through) for s in streams]
    with warnings.catch_warnings():  # the filters -W adds go with it
        warnings.formatwarning = python_formatwarning
        try:
            # what python does with -W at its start (a bad value: one line, then ignored)
            warnings._processoptions([value for letter, value in flags if letter == "W"])
            if ("u", None) in flags:  # unbuffered; here written through at each line
                for s in streams:
                    s.reconfigure(line_buffering=True, write_through=True)
            if ("B", None) in flags:
                sys.dont_write_bytecode = True
            yield
        finally:
            sys.dont_write_bytecode, warnings.formatwarning = saved
            for s, (line, through) in zip(streams, buffering):
                s.reconfigure(line_buffering=line, write_through=through)


def python_formatwarning(message, category, filename, lineno, line=None) -> str:
    """A warning as Python's own ``warnings.formatwarning`` shows it (the CLI replaces it)."""
    line = linecache.getline(filename, lineno) if line is None else line
    source = f"  {line.strip()}\n" if line and line.strip() else ""
    return f"{filename}:{lineno}: {category.__name__}: {message}\n{source}"


def run_script(script: Script, obs: Observer, cfg, debug: bool) -> dict:
    """The script run as ``__main__`` under ``obs`` to its end or ``cfg.steps``: how it ended."""
    profiler = Profiler() if cfg.profile else None

    def step(optimizer, args, kwargs) -> None:
        if obs.ending:  # after --steps: one more step may train on a batch read ahead
            obs.late_steps += 1
            if obs.eval_batches or obs.late_steps > 1:
                obs.stopped = "training"  # the script trained on, with no evaluation between
                raise Stop
            return
        obs.steps += 1
        if profiler:
            profiler.step(obs.steps)
        if obs.steps >= cfg.steps and not cfg.eval_steps:
            raise Stop
        obs.ending = obs.steps >= cfg.steps  # --eval-steps: the training pass ends here

    name, saved = script.name, (sys.argv, sys.path[:], os.getcwd())
    sys.argv = [name, *script.argv]
    here = str(Path(name).resolve().parent) if script.kind == "path" else os.getcwd()
    sys.path.insert(0, here)
    hook = register_optimizer_step_post_hook(step)
    ended, status, error = "end", 0, None
    try:
        with as_python_would(script.flags), watching(obs, cfg), obs:
            if script.kind == "path":  # python's __file__ is absolute since 3.9
                runpy.run_path(str(Path(name).absolute()), run_name="__main__")
            else:
                runpy.run_module(name, run_name="__main__", alter_sys=True)
    except Stop:
        ended = obs.stopped or "steps"
    except SystemExit as stop:
        code = stop.code
        ended, status = "exit", code if isinstance(code, int) else int(code is not None)
        error = None if status == 0 else f"exited with status {status}"
        if isinstance(code, str):
            error += f" ({code})"
    except Exception as err:  # the script's own: reported, and doctor exits 1
        if debug:
            traceback.print_exc()
        ended, status, error = "error", 1, _raised(err, obs.start)
    finally:
        hook.remove()
        sys.argv, sys.path[:] = saved[:2]
        os.chdir(saved[2])
        if profiler:
            profiler.close()
        group.end()  # a script stopped at --steps never destroys its process group
    return dict(ended=ended, exit_status=status, error=error, profile=profiler and profiler.result)


# torch re-raises an exception of a DataLoader worker (or its pin-memory thread) in the main
# process as "Caught E in DataLoader worker process 0.\nOriginal Traceback ...\nE: message"
_WORKER = re.compile(r"Caught \w+ (in .+?)\.?\nOriginal Traceback", re.S)
_FRAME = re.compile(r'^\s*File "(.+)", line (\d+)', re.M)


def _raised(err: Exception, start: Path) -> str:
    """``raised E: message (file:line)``: the script's own message and its innermost line
    of the script; for an error in a DataLoader worker, the worker's, as torch kept them."""
    text, name = str(err).strip(), type(err).__name__
    worker = _WORKER.match(text)
    if worker:
        last = text.splitlines()[-1]
        first = last.split(": ", 1)[1] if last.startswith(f"{name}: ") else last
        lines = [(f, n) for f, n in _FRAME.findall(text) if not is_library(f)]
    else:
        first = (text.splitlines() or [""])[0]
        frames = traceback.walk_tb(err.__traceback__)
        lines = [(f.f_code.co_filename, n) for f, n in frames if is_script(f)]
    at = f"{short_path(lines[-1][0], start)}:{lines[-1][1]}" if lines else "?"
    where = f" {worker.group(1)}" if worker else ""
    return f"raised {name}{where}: {first} ({at})"


class Profiler:
    """``torch.profiler`` over ``PROFILED`` steps after ``WARMUP``: Memcpy HtoD and kernel ms."""

    def __init__(self) -> None:
        self.prof, self.result = None, None

    def step(self, n: int) -> None:
        if n == WARMUP:
            torch.cuda.synchronize()  # the recorded window starts with an idle device
            acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            self.prof = torch.profiler.profile(activities=acts)
            self.prof.__enter__()
        elif n == WARMUP + PROFILED and self.prof is not None:
            torch.cuda.synchronize()  # every kernel and copy of the window is done
            prof = self.close()
            from .profiling import trace_totals  # imports the trainer: only when asked

            with tempfile.TemporaryDirectory() as tmp:
                prof.export_chrome_trace(f"{tmp}/trace.json")
                kernel_us, memcpy = trace_totals(Path(tmp) / "trace.json")
            copy_us = sum(m["us"] for m in memcpy.values())
            share = copy_us / (copy_us + kernel_us) if copy_us + kernel_us else 0.0
            ms = dict(memcpy_htod_ms=copy_us / 1e3 / PROFILED, kernel_ms=kernel_us / 1e3 / PROFILED)
            self.result = {"steps": PROFILED, **ms, "memcpy_share": share}

    def close(self) -> torch.profiler.profile | None:
        """Stop the profiler if it runs (the script may end inside the window)."""
        prof, self.prof = self.prof, None
        if prof is not None:
            prof.__exit__(None, None, None)
        return prof
