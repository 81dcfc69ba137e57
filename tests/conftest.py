from __future__ import annotations

import contextlib
import functools
import http.server
import io
import json
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

# OpenMP threads that spin-wait while the other core is busy make every CPU step 3-10x
# slower on a loaded machine (a 1-epoch MNIST mlp: 26.6 s of training with another `make
# test` running, 4.5 s with this; issue 21). Set before torch loads OpenMP, here and in every
# process the tests start; a value the caller set is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# The tests sit in a folder per layer (core, kinds, integrations, storage, trainer, tools,
# meta); what they share is here: _helpers.py and golden/, importable from each, also in the
# programs the tests start (a test file run under torchrun or accelerate imports _helpers).
TESTS = str(Path(__file__).resolve().parent)
sys.path.insert(0, TESTS)
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (os.environ.get("PYTHONPATH"), TESTS)))

# The Ctrl-C tests send SIGINT to the processes they start, as a terminal does. A suite
# started in the background by a non-interactive shell (`make test &`, nohup) inherits SIGINT
# ignored, and an ignored signal stays ignored across exec: those processes would never see
# it (exit 0 after a full run). A handler here is reset to the default in each child.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# The Ray tests start Ray themselves (ray.init) and stop it mid-iteration (doctor's --steps).
# Ray Data's prefetch threads outlive ray.shutdown() on a busy machine, and their next call
# would start a new local Ray from that thread; its GCS dies with the thread, and 60 s later
# Ray's core worker ends the whole process with exit 1, silently (an xdist worker "node
# down" in whatever test it runs then). Without auto-connect that call raises in its thread.
os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")


@pytest.fixture(autouse=True, scope="session")
def _latecast_env(tmp_path_factory):
    """No test touches ~/.cache/latecast or reads LATECAST_*; one cache a session (MNIST
    decoded once)."""
    patch = pytest.MonkeyPatch()
    patch.setenv("LATECAST_CACHE", str(tmp_path_factory.mktemp("latecast-cache")))
    for var in ("LATECAST_DATA", "LATECAST_MIRRORS", "LATECAST_DECODER", "LATECAST_STOP_AT"):
        patch.delenv(var, raising=False)
    yield
    patch.undo()


@pytest.fixture(params=["simplejpeg", "torchcodec", "torchvision"])
def decoder(request, monkeypatch):
    """Each test once per decoder: simplejpeg (a CPU device's first choice), TorchCodec's,
    and torchvision's fallback (the one the GPU machine, without TorchCodec, runs)."""
    from latecast.kinds import decode

    pytest.importorskip(request.param)
    if request.param != "simplejpeg":
        monkeypatch.setenv("LATECAST_DECODER", request.param)
    decode.decoder.cache_clear(), decode.cpu_decoder.cache_clear()
    assert decode.cpu_decoder().startswith(request.param)
    yield request.param
    decode.decoder.cache_clear(), decode.cpu_decoder.cache_clear()


@pytest.fixture(scope="session")
def mnist():
    """The bundled MNIST train split (decoded once into the session's cache)."""
    import latecast

    return latecast.load_dataset("mnist", "train")


@pytest.fixture
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty decoded-dataset cache for one test."""
    path = tmp_path / "cache"
    monkeypatch.setenv("LATECAST_CACHE", str(path))
    return path


@dataclass
class CliRun:
    """What one ``latecast`` command did: unpacks as ``rc, json`` (the last stdout line
    parsed, or None), with the whole ``out`` and ``err`` beside."""

    rc: int
    json: dict | None
    out: str
    err: str

    def __iter__(self):
        return iter((self.rc, self.json))


@pytest.fixture(scope="session")
def run_cli():
    """``run_cli(*argv, process=False)``: the CLI's ``main`` in this process (fast), or with
    ``process=True`` a real ``python -m latecast`` (exit codes, signals, stderr as a user
    sees it). Arguments may be paths or numbers."""

    def run(*argv, process: bool = False, timeout: float = 300, env: dict | None = None) -> CliRun:
        args = [str(a) for a in argv]
        if process:
            proc = subprocess.run(
                [sys.executable, "-m", "latecast", *args],
                capture_output=True,
                text=True,
                timeout=timeout,
                env={**os.environ, **(env or {})},
            )
            rc, out, err = proc.returncode, proc.stdout, proc.stderr
        else:
            from latecast.tools.cli import main

            out_buf, err_buf = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out_buf), contextlib.redirect_stderr(err_buf):
                try:
                    rc = main(args)
                except SystemExit as stop:  # argparse: --help (0) and bad usage (2)
                    rc = stop.code if isinstance(stop.code, int) else 1
            out, err = out_buf.getvalue(), err_buf.getvalue()
        last = out.strip().splitlines()[-1] if out.strip() else ""
        return CliRun(rc, json.loads(last) if last.startswith("{") else None, out, err)

    return run


@pytest.fixture
def served(tmp_path):
    """A real HTTP server on 127.0.0.1 for ``tmp_path / "shards"``: its base URL."""
    folder = tmp_path / "shards"
    folder.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield folder, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture
def quick_retries(monkeypatch):
    """The reader's retry waits cut to 10 ms (a failed read still gives up after 4 retries)."""
    from latecast.storage import shards

    monkeypatch.setattr(shards, "RETRY_WAITS", (0.01,) * 4)
