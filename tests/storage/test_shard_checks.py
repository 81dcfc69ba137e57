"""Streamed shards checked on every path (issues 36, 37): a changed sample refused by its
CRC-32 wherever read; a duplicate key, a shard gone, a 503, a stray test label, a bomb one
line each; unindexed shards indexed by ``train``. Real HTTP servers, real processes."""

from __future__ import annotations

import http.server
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _helpers import flip, one_line_error, write_tar
from PIL import Image
from test_streams import (
    COUNTS,
    ROOT,
    TIMEOUT,
    Throttled,
    make_shards,
    serving,
)

pytestmark = pytest.mark.slow  # each test starts training runs

CHECKED = """
import os, signal, sys
from latecast.storage import stream
from latecast.tools.cli import main
from latecast.trainer import loop

stream.STAT_FILES = 4  # as a split of more than 512 samples: measuring reads no shard whole
kill_at, save = int(os.environ.get("KILL_AT_STEP", 0)), loop.Run.save


def save_then_die(run, name):  # killed right after the checkpoint of step KILL_AT_STEP
    save(run, name)
    if run.progress.step == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)


loop.Run.save = save_then_die
sys.exit(main(sys.argv[1:]))
"""


def launch(tmp_path: Path, world: int, argv: list, kill: int = 0) -> subprocess.CompletedProcess:
    """``latecast`` through ``CHECKED``: one process, or ``world`` ranks under torchrun."""
    (tmp_path / "checked.py").write_text(CHECKED)
    runner = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}"]
    cmd = [sys.executable, *(runner if world > 1 else []), tmp_path / "checked.py", *argv]
    env = {**os.environ, "KILL_AT_STEP": str(kill), "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run(list(map(str, cmd)), capture_output=True, text=True, cwd=tmp_path,
                          timeout=TIMEOUT, env=env)  # fmt: skip


def stream_position(at: int = 18) -> tuple[str, str]:
    """The shard and key at stream position ``at`` of epoch 0 (seed 0, buffer 1): rank 1's
    first sample and a resume's after 9 batches of 2, mid-shard."""
    from latecast.storage.stream import epoch_order

    S, _ = epoch_order(COUNTS[:-1], seed=0, epoch=0, buffer=1, shuffle=True)
    starts = np.cumsum([0, *COUNTS[:-1]])
    shard = int(np.searchsorted(starts, S[at], side="right")) - 1
    k = int(S[at] - starts[shard])
    assert k > 0 and not (shard == 0 and k < 4)  # mid-shard; not among the 4 measured
    return f"shard-{shard:03d}.tar", f"{100 * shard + k:06d}"


def test_a_sample_changed_after_indexing_is_refused_on_two_ranks_and_after_a_mid_shard_resume(
    tmp_path, run_cli
):
    """Stream position 18 (buffer 1) is mid-shard: rank 1's start of 2, and where a run
    killed after step 9 resumes; the sample there is changed after indexing."""
    import torch

    from latecast.storage.shards import write_index

    folder = tmp_path / "shards"
    make_shards(folder)
    spec = f"{folder}/shard-{{000..003}}.tar"
    write_index(spec)
    name, key = stream_position()
    named = f"{name}: sample '{key}': CRC-32"

    argv = ["train", spec, "--model", "cnn", "-b", 2, "--device", "cpu", "--epochs", 1,
            "--shuffle-buffer", 1, "--seed", 0, "--no-progress", "--checkpoint-every", 1,
            "--resume", "auto"]  # fmt: skip
    proc = launch(tmp_path, 1, [*argv, "--output-dir", "resumed"], kill=9)
    assert proc.returncode == -9, proc.stderr[-2000:]
    state = torch.load(tmp_path / "resumed" / "checkpoint.pt", weights_only=True)
    assert (state["loader"]["epoch"], state["loader"]["position"]) == (0, 9)
    flip(folder / name, key)
    proc = launch(tmp_path, 1, [*argv, "--output-dir", "resumed"])
    assert proc.returncode == 1 and named in proc.stderr, proc.stderr[-2000:]
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr[-2000:]

    proc = launch(tmp_path, 2, [*argv, "--output-dir", "two"])
    assert proc.returncode != 0 and named in proc.stderr, proc.stderr[-3000:]

    flip(folder / name, key)  # back as indexed
    index = json.loads((folder / "index.json").read_text())  # an index without CRC-32s
    for entry in index["shardlist"]:
        del entry["crc32"]
    (folder / "index.json").write_text(json.dumps(index))
    proc = run_cli("train", spec, "--check", "--output-dir", tmp_path / "old")
    assert proc.rc == 1 and "is damaged (run latecast index again)" in proc.err, proc.err


def write_samples(path: Path, samples: list[tuple[str, bytes, int]]) -> None:
    """A shard of ``(key, jpeg, label)`` samples, in that order (keys may repeat)."""
    pairs = [(key, (("jpg", jpg), ("cls", str(label).encode()))) for key, jpg, label in samples]
    write_tar(path, [(f"{key}.{ext}", data) for key, files in pairs for ext, data in files])


def small_jpeg(value: int = 90) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((24, 32, 3), value, np.uint8)).save(buf, "JPEG")
    return buf.getvalue()


def test_a_key_written_twice_and_a_decompression_bomb_are_refused_naming_shard_and_key(
    tmp_path, run_cli
):
    """A key twice in a row or later in the shard, a 631-byte JPEG saying 60000x60000: one
    line each at ``index`` and at ``train`` without an index."""
    jpg = small_jpeg()
    write_samples(tmp_path / "twice-000.tar", [("a", jpg, 0), ("a", jpg, 0), ("b", jpg, 1)])
    write_samples(tmp_path / "later-000.tar", [("a", jpg, 0), ("b", jpg, 1), ("a", jpg, 0)])
    one_line_error(run_cli("index", tmp_path / "twice-000.tar"), "twice-000.tar", "'a'", "twice")
    one_line_error(run_cli("index", tmp_path / "later-000.tar"), "later-000.tar", "'a'", "twice")

    buf = io.BytesIO()
    Image.new("L", (8, 8)).save(buf, "JPEG")
    bomb = bytearray(buf.getvalue())
    sof = bomb.index(b"\xff\xc0")
    bomb[sof + 5 : sof + 9] = (60000).to_bytes(2, "big") * 2  # height, width
    folder = tmp_path / "bomb"
    folder.mkdir()
    write_samples(folder / "s-000.tar", [("a", jpg, 0), ("boom", bytes(bomb), 1)])
    write_samples(folder / "s-001.tar", [("c", jpg, 0)])
    spec = f"{folder}/s-*.tar"
    said = ("s-000.tar", "'boom'", "60000x60000", "pixels allowed")
    one_line_error(run_cli("index", spec), *said)
    with pytest.warns(UserWarning, match="no index"):
        one_line_error(run_cli("train", spec, "--check", "--output-dir", tmp_path / "r"), *said)


class Unavailable(http.server.SimpleHTTPRequestHandler):
    """Answers 503 to the first ``busy`` requests for ``shard-001.tar`` (HEAD and GET)."""

    busy = 0

    def log_message(self, *args) -> None:
        pass

    def send_head(self):
        if self.path.endswith("shard-001.tar") and Unavailable.busy > 0:
            Unavailable.busy -= 1
            self.send_error(503)
            return None
        return super().send_head()


@pytest.fixture
def unavailable(tmp_path):
    """A real HTTP server on 127.0.0.1 (``Unavailable``) for ``tmp_path / "shards"``."""
    folder = tmp_path / "shards"
    make_shards(folder)
    with serving(folder, Unavailable) as (_, url):
        yield folder, url


def test_a_503_when_a_shard_is_opened_is_retried_as_reads_are(unavailable, run_cli, quick_retries):
    """fsspec asks the size with a HEAD, then a GET: a server busy for both answers (503)
    is retried, said once, at ``latecast index`` and at ``train``."""
    folder, url = unavailable
    Unavailable.busy = 2
    with pytest.warns(UserWarning, match="shard-001.tar: asking its size failed") as said:
        proc = run_cli("index", url, "--output", folder / "index.json")
    assert proc.rc == 0 and Unavailable.busy == 0, proc.err
    assert len([w for w in said if "retrying" in str(w.message)]) == 1
    Unavailable.busy = 2
    argv = ["train", url, "--model", "cnn", "-b", "8", "--device", "cpu", "--epochs", "1"]
    with pytest.warns(UserWarning, match="retrying"):
        proc = run_cli(*argv, "--no-progress", "--output-dir", folder.parent / "run")
    assert proc.rc == 0 and Unavailable.busy == 0, proc.err


def test_a_shard_gone_or_a_test_label_outside_the_train_classes_is_refused_before_a_step(
    served, run_cli, tmp_path
):
    """A train shard gone (404), the last the epoch reaches, is one line before the first
    step (not 60 steps in); a stray test label one line naming it (not accuracy 0)."""
    folder, base = served
    make_shards(folder, (60, 16, 60, 10))
    url = f"{base}/shard-{{000..003}}.tar"
    assert run_cli("index", url, "--output", folder / "index.json").rc == 0
    (folder / "shard-001.tar").rename(folder / "kept.tar")
    argv = ["train", url, "--model", "cnn", "-b", 2, "--device", "cpu", "--epochs", 1, "--seed", 0,
            "--shuffle-buffer", 4, "--checkpoint-every", 1, "--no-progress"]  # fmt: skip
    # (a shuffle buffer smaller than a shard, as usual)
    proc = launch(tmp_path, 1, [*argv, "--output-dir", "run"])
    assert not (tmp_path / "run" / "checkpoint.pt").exists(), proc.stderr[-2000:]
    line = proc.stderr.strip()
    assert proc.returncode == 1 and len(line.splitlines()) == 1, proc.stderr[-2000:]
    assert "shard-001.tar: no such shard" in line

    (folder / "kept.tar").rename(folder / "shard-001.tar")
    jpg = small_jpeg()
    write_samples(folder / "shard-003.tar", [("x", jpg, 2), ("y", jpg, 7)])  # train: 0..3
    assert run_cli("index", url, "--output", folder / "index.json").rc == 0
    proc = run_cli(*argv, "--output-dir", tmp_path / "run2")
    one_line_error(proc, "shard-003.tar", "'y'", "label 7", "classes 0..3")


QUICK = """
import sys
from latecast.storage import shards
shards.RETRY_WAITS = (0.01,) * 4  # retries as usual, without their 7.5 s of waits
from latecast.tools.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_dropped_connection_is_one_error_line_and_no_unclosed_connection(tmp_path, run_cli):
    """Connections for shard-001 closed halfway: each of 3 runs ends in the one error line,
    nothing from aiohttp after it (once "Unclosed connection" in half the runs)."""
    folder = tmp_path / "shards"
    make_shards(folder)
    try:
        with serving(folder) as (_, url):
            Throttled.cut = None
            assert run_cli("index", url, "--output", folder / "index.json").rc == 0
            Throttled.cut = "close"
            for run in range(3):
                argv = ["train", url, "--model", "cnn", "-b", "8", "--device", "cpu", "--epochs",
                        "1", "--no-progress", "--output-dir", tmp_path / f"run{run}"]  # fmt: skip
                proc = subprocess.run([sys.executable, "-c", QUICK, *map(str, argv)], text=True,
                                      capture_output=True, timeout=TIMEOUT)  # fmt: skip
                lines = proc.stderr.strip().splitlines()
                errors = [line for line in lines if not line.startswith("latecast: warning:")]
                assert proc.returncode == 1 and len(lines) == 2, proc.stderr[-3000:]
                assert "shard-001.tar: read failed at byte" in errors[0]
    finally:
        Throttled.cut = "close"


def test_unindexed_shards_train_local_and_over_http_the_index_kept_for_the_next_run(
    served, run_cli, fresh_cache
):
    """Local shards: ``index.json`` written beside them, said in one line. Over HTTP: into
    the cache, named by the shards' URLs and sizes; a second run reads it (no rebuild)."""
    local = served[0].parent / "local"
    make_shards(local)
    spec = f"{local}/shard-*.tar"
    argv = ["--model", "cnn", "-b", "8", "--device", "cpu", "--epochs", "1", "--no-progress"]
    with pytest.warns(UserWarning, match="no index of these shards") as said:
        rc, summary = run_cli("train", spec, *argv, "--json", "--output-dir", local / "run")
    assert rc == 0 and summary["step"] == 5 and (local / "index.json").exists()
    assert len([w for w in said if "no index" in str(w.message)]) == 1

    folder, base = served
    make_shards(folder)
    url = f"{base}/shard-{{000..003}}.tar"
    with pytest.warns(UserWarning, match="no index of these shards"):
        rc, summary = run_cli("train", url, *argv, "--json", "--output-dir", folder / "r1")
    assert rc == 0 and summary["step"] == 5 and not (folder / "index.json").exists()
    (kept,) = (fresh_cache / "shard-index").glob("*.json")
    made = kept.stat().st_mtime_ns
    import warnings

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        rc, summary = run_cli("train", url, *argv, "--json", "--output-dir", folder / "r2")
    assert rc == 0 and summary["step"] == 5 and kept.stat().st_mtime_ns == made
    assert not [w for w in said if "no index" in str(w.message)]


def read_only(monkeypatch, *folders: Path) -> None:
    """``folders`` read-only as ``find_index`` asks (``os.access``; chmod binds no root)."""
    from latecast.storage import shards

    real, shut = shards.os.access, {str(f.resolve()) for f in folders}
    monkeypatch.setattr(
        shards.os, "access", lambda p, mode: os.path.realpath(p) not in shut and real(p, mode)
    )


def test_same_named_shards_in_two_read_only_folders_have_an_index_each(
    tmp_path, fresh_cache, monkeypatch
):
    """Two read-only folders of same-named, same-sized shards get an index each in the
    cache (keyed by the names as typed, the second took the first's: refused)."""
    from latecast.storage.stream import open_shards, verify

    first, second = tmp_path / "a", tmp_path / "b"
    make_shards(first)
    make_shards(second)
    flip(second / "shard-000.tar", "000003")
    read_only(monkeypatch, first, second)
    for folder in (first, second):
        monkeypatch.chdir(folder)
        with pytest.warns(UserWarning, match="no index of these shards"):
            ds = open_shards("shard-*.tar")
        assert "36 samples read whole" in verify(ds)
        assert not (folder / "index.json").exists()
    assert len(list((fresh_cache / "shard-index").glob("*.json"))) == 2


def test_train_check_on_unindexed_shards_checks_them_and_writes_nothing(
    served, run_cli, fresh_cache, tmp_path
):
    """``--check`` (local and over HTTP) reads and checks each shard, says so once, and
    writes no index (it once did), no output folder; a run after it keeps the index."""
    local = tmp_path / "local"
    make_shards(local)
    folder, base = served
    make_shards(folder)
    argv = ["--model", "cnn", "-b", "8", "--device", "cpu", "--json"]
    for spec in (f"{local}/shard-*.tar", f"{base}/shard-{{000..003}}.tar"):
        with pytest.warns(UserWarning, match="no index of these shards") as said:
            rc, summary = run_cli("train", spec, *argv, "--check", "--output-dir", tmp_path / "r")
        assert rc == 0 and summary["checked"] and summary["train_samples"] == 36
        (line,) = [str(w.message) for w in said if "no index" in str(w.message)]
        assert "reading each once to check them, writing nothing (--check)" in line, line
    assert not (local / "index.json").exists() and not (folder / "index.json").exists()
    assert not fresh_cache.exists() and not (tmp_path / "r").exists()
    assert sorted(p.name for p in local.iterdir()) == [f"shard-00{i}.tar" for i in range(4)]

    spec = f"{local}/shard-*.tar"  # the index --check built, not read again: written now
    rc, _ = run_cli("train", spec, *argv, "--epochs", 1, "--no-progress", "--output-dir",
                    tmp_path / "run")  # fmt: skip
    assert rc == 0 and (local / "index.json").exists()


def test_an_unwritable_cache_keeps_the_index_in_memory_for_the_run_said_once(
    served, run_cli, tmp_path, monkeypatch
):
    """``$LATECAST_CACHE`` a file: the index made over HTTP is used for both splits, not
    kept, said once; the file left as it was."""
    folder, base = served
    make_shards(folder)
    cache = tmp_path / "not-a-folder"
    cache.write_text("mine")
    monkeypatch.setenv("LATECAST_CACHE", str(cache))
    argv = ["--model", "cnn", "-b", "8", "--device", "cpu", "--epochs", 1, "--no-progress"]
    url = f"{base}/shard-{{000..003}}.tar"
    with pytest.warns(UserWarning, match="no index of these shards|cannot keep") as said:
        rc, summary = run_cli("train", url, *argv, "--json", "--output-dir", tmp_path / "run")
    assert rc == 0 and summary["step"] == 5
    lines = [str(w.message) for w in said]
    (kept,) = [line for line in lines if "cannot keep" in line]
    assert kept.startswith(str(cache)) and "kept in memory for this run only" in kept
    assert len([line for line in lines if "no index" in line]) == 1
    assert cache.read_text() == "mine" and not (folder / "index.json").exists()


def test_a_stale_cached_index_over_http_names_a_command_that_indexes_them_again(
    served, run_cli, fresh_cache, tmp_path
):
    """A shard rewritten (size kept): the refusal names a command that, run as said, makes
    the next ``train`` work ("run latecast index again" could not be followed over HTTP)."""
    import re
    import shlex

    folder, base = served
    make_shards(folder)
    url = f"{base}/shard-{{000..003}}.tar"
    argv = ["train", url, "--model", "cnn", "-b", "8", "--device", "cpu", "--epochs", 1,
            "--no-progress", "--output-dir"]  # fmt: skip
    with pytest.warns(UserWarning, match="no index of these shards"):
        assert run_cli(*argv, tmp_path / "r1").rc == 0
    (cached,) = (fresh_cache / "shard-index").glob("*.json")
    flip(folder / "shard-000.tar", "000003")
    line = one_line_error(run_cli(*argv, tmp_path / "r2"), "shard-000.tar", "changed since")
    said = re.search(r"run latecast (index .*)\)$", line)
    assert said and f"--output {cached}" in line, line
    assert run_cli(*shlex.split(said[1])).rc == 0
    proc = run_cli(*argv, tmp_path / "r3")
    assert proc.rc == 0, proc.err
    assert [p.name for p in cached.parent.iterdir()] == [cached.name]
