"""Streamed photos: WebDataset shards over HTTP on 2 ranks and an HF parquet through ``wrap``
(issue 16); shards streamed by latecast (issue 25) over real HTTP servers (killed, closing
early), a real S3 endpoint and local files: every sample once an epoch across kills and
resumes on other rank counts."""

from __future__ import annotations

import contextlib
import functools
import http.server
import io
import json
import os
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from _helpers import flip, one_line_error
from PIL import Image

from latecast.storage.shards import write_index

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 300  # seconds for one launch; a hang fails instead of blocking CI
pytestmark = pytest.mark.slow  # each test starts Python processes with DataLoader workers


def run(*argv, cwd: Path) -> str:
    env = {**os.environ, "HF_HOME": str(cwd / "hf"), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, *map(str, argv)], capture_output=True, text=True, timeout=TIMEOUT,
        cwd=cwd, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_webdataset_shards_over_http_two_ranks_read_disjoint_shards_every_sample_once(served):
    pytest.importorskip("webdataset")
    folder, base = served
    example = ROOT / "examples" / "webdataset_stream.py"
    # writes the shards, serves them itself
    one = run(example, "--shards", folder, "--count", 4, "--per-shard", 24, "--report", "one",
              cwd=folder.parent)  # fmt: skip
    every = json.loads((folder.parent / "one" / "rank-0.json").read_text())
    assert "rank 0: 96 photos an epoch" in one and len(set(every)) == 96
    url = f"{base}/shard-{{000..003}}.tar"
    out = run("-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", example,
              "--url", url, "--report", "two", cwd=folder.parent)  # fmt: skip
    ranks = [json.loads((folder.parent / "two" / f"rank-{r}.json").read_text()) for r in (0, 1)]
    shards = [{k[:3] for k in keys} for keys in ranks]  # a key starts with its shard's number
    assert len(ranks[0]) == len(ranks[1]) == 48 and not shards[0] & shards[1]
    assert sorted(ranks[0] + ranks[1]) == sorted(every)  # together: every sample once
    assert "rank 1: 48 photos an epoch" in out and "JPEG bytes" in out


def test_hugging_face_datasets_parquet_with_undecoded_images(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = []
    for i in range(40):
        buf = io.BytesIO()
        Image.fromarray(np.full((40, 50, 3), 5 * i, np.uint8)).save(buf, "JPEG")
        rows.append({"bytes": buf.getvalue(), "path": f"{i}.jpg"})
    features = datasets.Features(image=datasets.Image(), label=datasets.Value("int64"))
    ds = datasets.Dataset.from_dict({"image": rows, "label": [i % 10 for i in range(40)]},
                                    features=features)  # fmt: skip
    ds.to_parquet(str(tmp_path / "photos.parquet"))
    out = run(ROOT / "examples" / "hf_photos.py", "--parquet", "photos.parquet", cwd=tmp_path)
    jpeg_bytes = sum(len(r["bytes"]) for r in rows)
    assert "40 photos in 1 epochs of 40" in out and f"host->device {jpeg_bytes} JPEG" in out


def write_shard(path: Path, first: int, n: int, prefix: str = "", gz: bool = False) -> None:
    """A WebDataset shard (a tar: KEY.jpg, KEY.cls) of n generated 24x32 photos, keys
    ``first``..; ``prefix="./"`` writes members as ``tar -C dir .`` does (and its ``./``)."""
    with tarfile.open(path, "w:gz" if gz else "w") as tar:
        if prefix:
            folder = tarfile.TarInfo("./")
            folder.type = tarfile.DIRTYPE
            tar.addfile(folder)
        for i in range(first, first + n):
            img = np.full((24, 32, 3), 40 + 20 * (i % 4), np.uint8)
            img[(i % 4) * 5 : (i % 4) * 5 + 6, 4:20] = 240
            buf = io.BytesIO()
            Image.fromarray(img).save(buf, "JPEG", quality=90)
            for ext, data in (("jpg", buf.getvalue()), ("cls", str(i % 4).encode())):
                info = tarfile.TarInfo(f"{prefix}{i:06d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


COUNTS = (13, 16, 7, 10)  # samples per shard, the last the test split: 36 train, uneven


def make_shards(folder: Path, counts=COUNTS) -> list[str]:
    """Shards ``shard-000.tar``.. of ``counts`` samples; every train key, in order."""
    folder.mkdir(exist_ok=True)
    for s, n in enumerate(counts):
        write_shard(folder / f"shard-{s:03d}.tar", 100 * s, n)
    return [f"{100 * s + i:06d}" for s, n in enumerate(counts[:-1]) for i in range(n)]


def test_train_over_http_resumes_on_another_port_and_refuses_changed_shards(served, run_cli):
    """Trains over HTTP; resumes on another port (identity by content); a bit changed is one
    line naming the sample's CRC-32, a resume after re-indexing one naming the fingerprint."""
    folder, base = served
    make_shards(folder)
    url, out = f"{base}/shard-{{000..003}}.tar", folder.parent / "run"
    argv = ["train", url, "--model", "cnn", "-b", "8", "--device", "cpu", "--no-progress"]
    rc, made = run_cli("index", url, "--output", folder / "index.json", "--json")
    assert rc == 0 and made["shards"] == 4 and made["samples"] == sum(COUNTS)
    rc, summary = run_cli(*argv, "--epochs", "1", "--output-dir", out, "--json")
    assert rc == 0 and summary["transfer"] == "jpeg" and summary["dataset"] == url
    assert summary["decoder"].split()[0] in ("simplejpeg", "torchcodec", "torchvision")
    assert summary["step"] == 5  # 36 train samples in batches of 8: the last one of 4
    with serving(folder, http.server.SimpleHTTPRequestHandler) as (_, other):  # elsewhere
        proc = run_cli(*argv[:1], other, *argv[2:], "--epochs", "1", "--output-dir", out,
                       "--resume", "auto")  # fmt: skip
    assert proc.rc == 0, proc.err
    with tarfile.open(folder / "shard-001.tar") as tar:
        last = [m.name[:-4] for m in tar.getmembers() if m.name.endswith(".jpg")][-1]
    flip(folder / "shard-001.tar", last)  # inside the last file's scan data
    said = ("shard-001.tar", f"'{last}': CRC-32", "run latecast index")
    one_line_error(run_cli("info", url, "--verify"), *said)
    assert run_cli("index", url, "--output", folder / "index.json").rc == 0
    resumed = run_cli(*argv, "--epochs", "1", "--output-dir", out, "--resume", "auto")
    one_line_error(resumed, "data_fingerprint")


def test_store_folders_spelled_three_ways_are_one_store_to_resume(tmp_path, run_cli, monkeypatch):
    import latecast
    from latecast.storage.store import write_store

    rng = np.random.default_rng(0)
    images, labels = rng.integers(0, 256, (40, 8, 8, 1), np.uint8), np.arange(40) % 4
    for split in ("train", "test"):
        ds = latecast.from_arrays(images, labels, name="st", split=split)
        write_store(ds, tmp_path / "st" / split)
    monkeypatch.chdir(tmp_path)
    argv = ["--model", "mlp", "--epochs", "1", "-b", "8", "--device", "cpu", "--no-progress"]
    assert run_cli("train", "st/", *argv, "--output-dir", "run").rc == 0
    for spelling in ("./st", str(tmp_path / "st")):
        proc = run_cli("train", spelling, *argv, "--output-dir", "run", "--resume", "auto")
        assert proc.rc == 0, proc.err


class Throttled(http.server.SimpleHTTPRequestHandler):
    """Serves ``shard-001.tar``'s first half, then ``cut``: "close" short of its
    Content-Length, "hang" (writes ``sent``, waits to be killed)."""

    cut = "close"

    def log_message(self, *args) -> None:
        pass

    def copyfile(self, source, outputfile) -> None:
        if not self.path.endswith("shard-001.tar") or not self.cut:
            return super().copyfile(source, outputfile)
        data = source.read()
        outputfile.write(data[: len(data) // 2])
        outputfile.flush()
        if self.cut == "hang":
            Path(self.directory, "..", "sent").write_text("half")
            time.sleep(300)  # killed before
        self.close_connection = True


SERVER = """
import functools, http.server, sys
sys.path.insert(0, sys.argv[2])
from test_streams import Throttled
Throttled.cut = "hang"
handler = functools.partial(Throttled, directory=sys.argv[1])
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


@contextlib.contextmanager
def serving(folder: Path, handler=Throttled):
    """An HTTP server (``handler``, ``Throttled`` unless said) of ``folder`` on 127.0.0.1: it
    and the shards' URL."""
    handler = functools.partial(handler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server, f"http://127.0.0.1:{server.server_address[1]}/shard-{{000..003}}.tar"
    finally:
        server.shutdown()


def test_a_server_killed_mid_shard_and_one_that_closes_early_are_errors_not_early_ends(
    tmp_path, run_cli, quick_retries
):
    """Without an index (``latecast index``) and with one (``train``), a read cut short is one
    line naming the shard and the byte, after retries said once; never a shorter split."""
    folder = tmp_path / "shards"
    make_shards(folder)
    with serving(folder) as (server, url):
        with pytest.warns(UserWarning, match="retrying from there"):
            proc = run_cli("index", url, "--output", tmp_path / "i.json")
        one_line_error(proc, "shard-001.tar", "read failed at byte", "4 retries")
        Throttled.cut = None  # a good server: indexed, copied where train looks
        assert run_cli("index", url, "--output", folder / "index.json").rc == 0
        Throttled.cut = "close"
        argv = ["train", url, "--model", "cnn", "-b", "8", "--device", "cpu", "--epochs", "1"]
        with pytest.warns(UserWarning, match="retrying from there") as said:
            proc = run_cli(*argv, "--output-dir", tmp_path / "run", "--no-progress")
        one_line_error(proc, "shard-001.tar", "read failed at byte")
        assert len([w for w in said if "retrying" in str(w.message)]) == 1  # said once
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(folder), str(ROOT / "tests" / "storage")],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        port = int(proc.stdout.readline())
        url = url.replace(str(server.server_address[1]), str(port))

        def kill_when_half_sent() -> None:
            while not (tmp_path / "sent").exists():
                time.sleep(0.05)
            os.kill(proc.pid, signal.SIGKILL)  # the server goes away mid-shard

        threading.Thread(target=kill_when_half_sent, daemon=True).start()
        with pytest.warns(UserWarning, match="retrying from there") as said:
            proc_ = run_cli("index", url, "--output", tmp_path / "i.json")
        assert len([w for w in said if "retrying" in str(w.message)]) == 1
        one_line_error(proc_, "shard-001.tar", "read failed at byte", "4 retries")
    finally:
        proc.kill()
        proc.wait(timeout=TIMEOUT)


def test_bad_shards_are_one_line_each_and_odd_good_ones_read(tmp_path, run_cli):
    """``./`` members and ``.tar.gz`` read; an empty shard skipped and said; a missing
    ``.cls``, an empty test shard, a cut shard, a damaged JPEG: one line naming shard, key."""
    from _helpers import damage_scan, noise_jpeg

    (d := tmp_path / "ok").mkdir()
    write_shard(d / "a-000.tar", 0, 5, prefix="./")
    write_shard(d / "a-001.tar.gz", 10, 4, gz=True)
    write_shard(d / "a-002.tar", 20, 0)  # a valid tar without members
    write_shard(d / "a-003.tar", 30, 3)
    spec = f"{d}/a-00?.tar*"
    with pytest.warns(UserWarning, match="a-002.tar: no samples"):
        rc, made = run_cli("index", spec, "--json")
    assert rc == 0 and made["samples"] == 12 and made["empty"] == ["a-002.tar"]
    keys = json.loads((d / "index.json").read_text())["shardlist"][0]["keys"]
    assert keys == [f"{i:06d}" for i in range(5)]  # ./000000.jpg is key 000000
    with pytest.warns(UserWarning, match="a-002.tar: no samples"):
        rc, found = run_cli("train", spec, "--check", "--json", "--output-dir", tmp_path / "r")
    assert rc == 0 and (found["train_samples"], found["test_samples"]) == (9, 3)

    (bad := tmp_path / "bad").mkdir()
    write_shard(bad / "b-000.tar", 0, 4)
    write_shard(bad / "b-001.tar", 10, 0)
    with pytest.warns(UserWarning, match="b-001.tar: no samples"):
        assert run_cli("index", f"{bad}/b-*.tar").rc == 0
        proc = run_cli("train", f"{bad}/b-*.tar", "--check", "--output-dir", tmp_path / "r")
    one_line_error(proc, "test shard", "b-001.tar", "no samples")
    one = run_cli("train", bad / "b-000.tar", "--check", "--output-dir", tmp_path / "r")
    one_line_error(one, "1 shard(s); give two or more")
    one_line_error(run_cli("index", f"{bad}/none-*.tar"), "no shards match it")
    with tarfile.open(bad / "b-002.tar", "w") as tar:  # a sample without its label
        tar.addfile(tarfile.TarInfo("000009.jpg"), io.BytesIO(b""))
    one_line_error(
        run_cli("index", f"{bad}/b-002.tar"), "b-002.tar", "'000009' has no .jpg and .cls"
    )

    cut = tmp_path / "cut"
    make_shards(cut)
    url = f"{cut}/shard-{{000..003}}.tar"
    assert run_cli("index", url).rc == 0
    whole = (cut / "shard-001.tar").read_bytes()
    with tarfile.open(cut / "shard-001.tar") as tar:
        members = tar.getmembers()
    (cut / "shard-001.tar").write_bytes(whole[: members[9].offset])  # an interrupted copy
    argv = ["train", url, "--model", "cnn", "-b", "8", "--device", "cpu", "--epochs", "1"]
    proc = run_cli(*argv, "--no-progress", "--output-dir", tmp_path / "run")  # refused when read
    one_line_error(proc, "shard-001.tar", "the index says 51,200")
    one_line_error(run_cli("index", url), "shard-001.tar", "ends inside a tar header")
    (cut / "shard-001.tar").write_bytes(whole[: members[9].offset_data + 10])
    one_line_error(run_cli("index", url), "shard-001.tar", "ends inside a member")

    (cut / "shard-001.tar").write_bytes(whole)
    with tarfile.open(cut / "shard-001.tar") as tar, tarfile.open(cut / "x.tar", "w") as out:
        for m in tar.getmembers():  # 000102.jpg: a photo with damaged scan data
            damaged = damage_scan(noise_jpeg(np.random.default_rng(0)))
            data = damaged if m.name == "000102.jpg" else tar.extractfile(m).read()
            m.size = len(data)
            out.addfile(m, io.BytesIO(data))
    os.replace(cut / "x.tar", cut / "shard-001.tar")
    assert run_cli("index", url).rc == 0  # its structure is whole: only decoding sees it
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        proc = run_cli(*argv, "--no-progress", "--overwrite", "--output-dir", tmp_path / "run")
    named = "shard-001.tar: sample '000102': damaged JPEG data"
    assert named in proc.err or any(named in str(w.message) for w in said), proc.err


def test_shards_on_a_real_s3_endpoint_through_s3fs(tmp_path, run_cli, monkeypatch):
    """moto's S3 server on 127.0.0.1: index written to the bucket beside the shards, train
    streams them through s3fs."""
    server_mod = pytest.importorskip("moto.server")
    s3fs = pytest.importorskip("s3fs")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    for key, value in [("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                       ("AWS_DEFAULT_REGION", "us-east-1"), ("AWS_ENDPOINT_URL", endpoint),
                       ("FSSPEC_S3_ENDPOINT_URL", endpoint)]:  # fmt: skip
        monkeypatch.setenv(key, value)
    try:
        s3fs.S3FileSystem.clear_instance_cache()
        fs = s3fs.S3FileSystem(endpoint_url=endpoint)
        fs.mkdir("shards")
        make_shards(tmp_path / "local")
        for f in sorted((tmp_path / "local").iterdir()):
            fs.put(str(f), f"shards/{f.name}")
        url = "s3://shards/shard-{000..003}.tar"
        rc, made = run_cli("index", url, "--json")
        assert rc == 0 and made["index"] == "s3://shards/index.json"
        assert fs.exists("shards/index.json")
        argv = ["train", url, "--model", "cnn", "-b", "8", "--device", "cpu", "--epochs", "1"]
        rc, summary = run_cli(*argv, "--no-progress", "--json", "--output-dir", tmp_path / "r")
        assert rc == 0 and summary["step"] == 5 and summary["dataset"] == url
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
        server.stop()


def test_a_stream_stopped_early_then_the_process_exiting_is_no_abort():
    """Stopped early, then exiting: the read-ahead thread is not left in torch's C++ code
    (the exit aborted, "terminate called without an active exception", -6)."""
    script = """
import sys, torch
from latecast.storage.stream import ahead_by_thread
torch.set_num_threads(1)
a = torch.randn(600, 600)
def items():  # each item torch's work with the GIL released, as a batch's build is
    while True:
        yield (a @ a @ a @ a).sum()
g = ahead_by_thread(items(), 2)
next(g)
g.close()
sys.exit(0)
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert proc.returncode == 0 and "terminate" not in proc.stderr, proc.stderr[-2000:]


WORKER = """
import json, os, signal, sys
from latecast.storage import stream
from latecast.tools.cli import main
from latecast.trainer import loop

report, kill_at = sys.argv[1], int(os.environ.get("KILL_AT_STEP", 0))
rank = os.environ.get("RANK", "0")
read = stream.Plan.read


def logged(plan, start):  # each training batch this rank reads: its epoch, number and keys
    if plan.source.split != "train":
        yield from read(plan, start)
        return
    with open(f"{report}-rank{rank}.jsonl", "a") as log:
        for k, (batch, ids, names) in enumerate(read(plan, start), start):
            keys = [n.rsplit("'", 2)[1] for n in names]
            log.write(json.dumps([plan.epoch, k, keys]) + "\\n")
            log.flush()
            yield batch, ids, names


stream.Plan.read = logged
save = loop.Run.save


def save_then_die(run, name):  # killed mid-epoch, right after that checkpoint is written
    save(run, name)
    if run.progress.step == kill_at and rank == "0":
        os.kill(os.getpid(), signal.SIGKILL)


loop.Run.save = save_then_die
sys.exit(main(sys.argv[2:]))
"""


def test_every_sample_once_an_epoch_across_ranks_kills_and_resumes_on_other_counts(tmp_path):
    """36 samples, batch 4, 3 epochs: 2 ranks killed after step 7, resumed on 1 killed after
    step 15, resumed on 2: every train key once an epoch, counted up to each checkpoint."""
    import torch

    keys = make_shards(tmp_path / "shards")
    spec = f"{tmp_path}/shards/shard-{{000..003}}.tar"
    write_index(spec)
    (tmp_path / "worker.py").write_text(WORKER)
    out, trained = tmp_path / "run", {}
    argv = ["train", spec, "--model", "cnn", "-b", 4, "--device", "cpu", "--epochs", 3,
            "--checkpoint-every", 1, "--no-progress", "--output-dir", out,
            "--resume", "auto"]  # fmt: skip
    for launch, (world, kill) in enumerate([(2, 7), (1, 15), (2, 0)]):
        report = tmp_path / f"launch{launch}"
        torchrun = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}"]
        cmd = [sys.executable, *torchrun, tmp_path / "worker.py", report, *argv]
        env = {**os.environ, "KILL_AT_STEP": str(kill), "PYTHONPATH": str(ROOT / "src")}
        proc = subprocess.run(list(map(str, cmd)), capture_output=True, text=True, cwd=tmp_path,
                              timeout=TIMEOUT, env=env)  # fmt: skip
        assert (proc.returncode != 0) == bool(kill), proc.stderr[-3000:]
        state = torch.load(out / "checkpoint.pt", weights_only=True)
        stop = (state["loader"]["epoch"], state["loader"]["position"]) if kill else (3, 0)
        for r in range(world):
            for line in Path(f"{report}-rank{r}.jsonl").read_text().splitlines():
                epoch, k, names = json.loads(line)
                if (epoch, k) < stop:  # what this launch trained before its checkpoint
                    trained.setdefault(epoch, []).extend(names)
    assert sorted(trained) == [0, 1, 2]
    for epoch, seen in trained.items():
        assert sorted(seen) == keys, epoch  # every key once: none repeated, none dropped


def test_the_index_is_a_wids_shard_index(tmp_path):
    """wids (WebDataset's indexed reader) reads ``index.json`` as its own shard index."""
    wids = pytest.importorskip("wids")
    keys = make_shards(tmp_path / "shards", (3, 5, 2))
    write_index(f"{tmp_path}/shards/shard-*.tar")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # its own deprecation of string specs
        ds = wids.ShardListDataset(str(tmp_path / "shards" / "index.json"))
        found = [ds[i]["__key__"] for i in range(len(ds))]
    assert found == [*keys, "000200", "000201"]  # the last shard too (not a split to wids)


def test_the_epochs_order_is_one_for_any_world_size_and_a_resume_leaves_what_was_not_taken():
    """The plans alone: for any world size the ranks' spans make the 1-rank order, equal
    step counts, and ``left`` after ``p`` batches plus what was taken is every sample once."""
    from types import SimpleNamespace

    from latecast.storage.stream import Plan

    rng = np.random.default_rng(0)
    for _ in range(40):
        counts = rng.integers(0, 30, rng.integers(1, 6)).tolist()
        stream = SimpleNamespace(counts=counts, buffer=int(rng.integers(1, 20)), name="s")
        total, batch, epoch = sum(counts), int(rng.integers(1, 6)), int(rng.integers(0, 3))
        args = dict(shuffle=True, seed=3, remaining=None)
        one = Plan(stream, epoch, 0, 1, batch, **args).ids
        assert sorted(one) == list(range(total))
        for world in range(2, 5):
            if total // world < -(-total // (world * batch)):  # refused: too few samples
                continue
            plans = [Plan(stream, epoch, r, world, batch, **args) for r in range(world)]
            assert np.array_equal(np.concatenate([p.ids for p in plans]), one)
            assert len({len(pl.sizes) for pl in plans}) == 1  # the same number of steps
            assert all(n > 0 for pl in plans for n in pl.sizes)  # none without a sample
            p = int(rng.integers(0, len(plans[0].sizes) + 1))
            taken = np.concatenate([pl.ids[: sum(pl.sizes[:p])] for pl in plans])
            left = Plan(stream, epoch, 0, 1, batch, **{**args, "remaining": plans[0].left(p)})
            assert sorted([*taken, *left.ids]) == list(range(total))


def test_a_stream_loaders_state_without_its_world_size_is_one_config_error(tmp_path, run_cli):
    """A resume splits what the saving ranks left, so a state without ``world_size`` is one
    ConfigError naming it, not a KeyError."""
    from latecast.errors import ConfigError
    from latecast.loader import Loader
    from latecast.storage.stream import open_shards

    make_shards(tmp_path / "s")
    assert run_cli("index", f"{tmp_path}/s/shard-*.tar").rc == 0
    loader = Loader(open_shards(f"{tmp_path}/s/shard-*.tar"), 4, device="cpu", seed=0)
    state = loader.state_dict()
    del state["world_size"]
    with pytest.raises(ConfigError, match=r"state\['world_size'\]"):
        loader.load_state_dict(state)
    loader.load_state_dict(loader.state_dict())  # whole, it loads
