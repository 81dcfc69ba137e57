"""Every data check on every path that reads data (issue 36): one table, check x path. A
cell runs and its check fires as the table says (one ``LatecastError`` or one warning naming
the file or sample), or is not applicable, with the reason in the table."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from _helpers import damage_mid_store, flip, lightning_trainer, silent_damage, write_tar
from PIL import Image
from test_shard_checks import small_jpeg, stream_position
from test_streams import ROOT, TIMEOUT, make_shards
from torch.utils.data import DataLoader

import latecast
from latecast.errors import LatecastError
from latecast.storage import stream

PATHS = ("store", "store_cut", "shards_1", "shards_2", "shards_resumed", "wrap_jpeg",
         "jpeg_folder", "lightning")  # fmt: skip


@dataclass(frozen=True)
class Fires:
    """The check fires on this path: ``kind`` ("error" or "warning"), once, its line holding
    every word (``{sample}``, ``{file}``: what the path calls the faulty sample or file)."""

    kind: str
    words: tuple[str, ...]


@dataclass(frozen=True)
class NotApplicable:
    reason: str


def E(*words: str) -> Fires:
    return Fires("error", words)


def W(*words: str) -> Fires:
    return Fires("warning", words)


WRITTEN = "nothing was written or indexed before: the bomb row is this file on this path"
VERIFY = (
    "a store's SHA-256 of all its images is read by latecast info --verify, not by training: "
    "its CRC-32 per file is the changed row"
)
OWN = "the files are the caller's own batches: latecast kept no checksum of them to compare"
FOLDER = NotApplicable("an image folder keeps no checksum (ImageFolder neither)")
BOMB = E("{sample}", "10000x10001", "pixels allowed")
CRC = E("{sample}: CRC-32", "the index says")


def row(store, shards, own, folder=None, **cells) -> dict[str, Fires | NotApplicable]:
    """A check's cells: ``store``, ``shards`` and ``own`` (wrap's, Lightning's, jpeg_folder's
    unless ``folder``) on their paths; ``cells`` each path's own."""
    given = dict(store=store, store_cut=store, wrap_jpeg=own, lightning=own)
    given.update(shards_1=shards, shards_2=shards, shards_resumed=shards, jpeg_folder=folder or own)
    return {path: cells.get(path, given[path]) for path in PATHS}


TABLE: dict[str, dict[str, Fires | NotApplicable]] = {
    # a file's bytes changed after latecast wrote or indexed it (one bit, sizes kept)
    "changed": row(
        W("{sample}: its bytes differ from the CRC-32"), CRC, NotApplicable(OWN), FOLDER
    ),  # fmt: skip
    # a file cut short: a store's data.bin, a shard, one JPEG file
    "cut_short": row(
        E("{file}", "bytes", "truncated or replaced"),
        E("{file}", "the index says", "cut short"),
        E("{sample}", "not a decodable JPEG"),
    ),  # fmt: skip
    # a decompression bomb: a JPEG of a few hundred bytes whose header says 10001x10000
    "bomb": row(BOMB, BOMB, BOMB),
    # the same bomb put in place of a file after it was written or indexed (same length)
    "bomb_swapped": row(BOMB, CRC, NotApplicable(WRITTEN)),
    # a whole JPEG (markers, frame header) that does not decode: its scan names no component
    "undecodable": row(*[E("{sample}: not a decodable JPEG")] * 3),
    # a label outside the classes: a store's labels.npy past meta.json's classes, a test
    # shard's label the train shards lack; wrap knows the classes only through mix=Mix(...)
    "label": row(
        E("{file}", "label 1", "outside 0..0"),
        E("{file}", "label 7", "outside the train shards' classes 0..3"),
        E("Mix: labels 0..3 outside 0..1"),
        E("Mix: labels 1..2 outside 0..1"),
    ),  # fmt: skip
    # arguments: the Loader's batch_size=0, --limit-train 0, a resume state from another
    # batch size, wrap's and the hook's unknown option, jpeg_folder of no folder
    "arguments": row(
        E("batch_size must be an integer in 1..", "got 0"),
        E("batch_size must be an integer in 1..", "got 0"),
        E("unknown option 'bogus'"),
        E("{file}", "no such folder"),
        store_cut=E("limit_train must be an integer >= 1", "got 0"),
        shards_resumed=E("loader state does not match", "batch_size 4 != 2"),
    ),  # fmt: skip
}
CHECKS = tuple(TABLE)


@dataclass
class Said:
    """What a path did: its error's one line (None: it ran through) and its warnings."""

    error: str | None
    warnings: list[str]
    names: dict  # what the table's {...} stand for on this path


def said(run, names: dict) -> Said:
    """``run()`` with every warning kept and a ``LatecastError`` caught."""
    with warnings.catch_warnings(record=True) as kept:
        warnings.simplefilter("always")
        try:
            run()
            error = None
        except LatecastError as err:
            error = str(err)
    return Said(error, [str(w.message) for w in kept], names)


# -- files ------------------------------------------------------------------------------------


def bomb(length: int = 0) -> bytes:
    """A grey JPEG whose header says 10001x10000 (just over ``MAX_PIXELS``: 100 MB decoded,
    should a check be missing), padded by a comment to ``length`` bytes."""
    buf = io.BytesIO()
    Image.new("L", (8, 8)).save(buf, "JPEG")
    data = bytearray(buf.getvalue())
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = (10001).to_bytes(2, "big") + (10000).to_bytes(2, "big")
    pad = length - len(data)
    if pad > 0:
        assert pad >= 4
        data[2:2] = b"\xff\xfe" + (pad - 2).to_bytes(2, "big") + bytes(pad - 4)
    return bytes(data)


def undecodable(jpeg: bytes) -> bytes:
    """``jpeg`` whose scan names component 9, which its frame does not have: SOI, frame
    header and EOI whole (every structure check passes), libjpeg refuses to decode it."""
    data = bytearray(jpeg)
    data[data.index(b"\xff\xda") + 5] = 9
    return bytes(data)


def cut(jpeg: bytes) -> bytes:
    """``jpeg`` cut inside its tables (not its scan, which some decoders fill grey): every
    decoder refuses it."""
    return jpeg[: 2 * len(jpeg) // 3]


# -- a store ------------------------------------------------------------------------------------

N, K, SIDE = 300, 149, 96  # K: mid-store (past data.bin's first MiB, before its last), and
# none of the 256 files opening a store checks: only the path reading it can see it


@pytest.fixture(scope="module")
def store_files() -> list[bytes]:
    rng, files = np.random.default_rng(0), []
    for _ in range(N):  # grey noise, ~9.6 KB a file: data.bin ~2.9 MB
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (SIDE, SIDE), np.uint8)).save(buf, "JPEG", quality=95)
        files.append(buf.getvalue())
    return files


def make_store(root: Path, files: list[bytes], k_file: bytes | None = None) -> Path:
    """``root/train`` (the ``N`` files, file ``K`` replaced by ``k_file``) and ``root/test``,
    written as ``latecast convert`` writes a JPEG store; labels alternate 0, 1."""
    from latecast.kinds.jpegfiles import EncodedDataset
    from latecast.kinds.jpegheader import jpeg_header
    from latecast.storage.store import write_store

    for split, n in (("train", N), ("test", 4)):
        part = list(files[:n])
        if split == "train" and k_file is not None:
            part[K] = k_file
        ds = EncodedDataset(
            name="photos", split=split, labels=(np.arange(n) % 2).astype(np.uint8),
            classes=("a", "b"), mean=(0.5,), std=(0.25,),
            data=np.frombuffer(b"".join(part), np.uint8),
            offsets=np.cumsum([0, *map(len, part)]).astype(np.int64),
            sizes=np.array([jpeg_header(f)[:2] for f in part], np.int32), channels=1,
            size=(SIDE, SIDE),
        )  # fmt: skip
        write_store(ds, root / split, source="test")
    return root


def store_fault(check: str, tmp_path: Path, files: list[bytes], monkeypatch) -> tuple[Path, dict]:
    """A store with ``check``'s fault in it; what the table's names stand for."""
    from latecast.storage import store

    root, train = tmp_path / "photos", tmp_path / "photos" / "train"
    names = {"sample": f"photos/train: sample {K}", "file": ""}
    if check == "bomb":  # written by a latecast without the pixel limit: refused now
        with pytest.raises(LatecastError, match=f"{names['sample']}: 10000x10001 image is lar"):
            make_store(root, files, bomb())
        with monkeypatch.context() as m:
            m.setattr(store, "MAX_PIXELS", 10**12)
            make_store(root, files, bomb())
        return root, names
    make_store(root, files, undecodable(files[K]) if check == "undecodable" else None)
    if check in ("changed", "bomb_swapped"):  # file K's bytes in place, sizes.npy as written
        damage = silent_damage if check == "changed" else lambda f: bomb(len(f))
        damage_mid_store(train / "data.bin", np.load(train / "offsets.npy"), K, damage)
    elif check == "cut_short":
        with open(train / "data.bin", "r+b") as f:
            f.truncate((train / "data.bin").stat().st_size - 1000)
        names["file"] = str(train / "data.bin")
    elif check == "label":  # labels.npy holds 0 and 1; meta.json now lists one class
        meta = json.loads((train / "meta.json").read_text())
        (train / "meta.json").write_text(json.dumps({**meta, "classes": ["a"]}))
        names["file"] = str(train / "labels.npy")
    return root, names


def run_store(check, tmp_path, store_files, monkeypatch, **_) -> Said:
    root, names = store_fault(check, tmp_path, store_files, monkeypatch)

    def run() -> None:
        ds = latecast.open_store(root, "train")
        batch = 0 if check == "arguments" else 100
        for _ in latecast.Loader(ds, batch, device="cpu"):
            pass

    return said(run, names)


def run_store_cut(check, tmp_path, store_files, monkeypatch, run_cli, **_) -> Said:
    """``latecast train`` in this process (its ``main``), the store cut to its first 200."""
    root, names = store_fault(check, tmp_path, store_files, monkeypatch)
    limit = "0" if check == "arguments" else "200"  # K = 149 lies inside the cut
    argv = ["train", root, "--model", "mlp", "--epochs", "1", "-b", "50", "--device", "cpu",
            "--limit-train", limit, "--limit-test", "3", "--no-progress",
            "--output-dir", tmp_path / "run"]  # fmt: skip
    with warnings.catch_warnings(record=True) as kept:
        warnings.simplefilter("always")
        proc = run_cli(*argv)
    lines = proc.err.strip().splitlines()
    assert proc.rc in (0, 1) and len(lines) == proc.rc, proc.err[-2000:]  # exit 1: one line
    return Said(lines[0] if lines else None, [str(w.message) for w in kept], names)


# -- shards ---------------------------------------------------------------------------------


def rewrite(path: Path, key: str, jpg: bytes | None = None, label: int | None = None) -> None:
    """The shard at ``path`` written again, sample ``key``'s JPEG or label replaced."""
    with tarfile.open(path) as tar:
        members = [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]
    new = {f"{key}.jpg": jpg, f"{key}.cls": None if label is None else str(label).encode()}
    write_tar(
        path, [(name, data if new.get(name) is None else new[name]) for name, data in members]
    )


def shards_made(folder: Path) -> str:
    from latecast.storage.shards import write_index

    make_shards(folder)
    spec = f"{folder}/shard-{{000..003}}.tar"
    write_index(spec)
    return spec


def shard_fault(check: str, folder: Path) -> dict:
    """``check``'s fault put into the indexed shards in ``folder``; the table's names."""
    from latecast.storage import shards

    name, key = stream_position()
    path, spec = folder / name, f"{folder}/shard-{{000..003}}.tar"
    names = {"sample": f"{path}: sample '{key}'", "file": str(path)}
    if check == "changed":
        flip(path, key)
    elif check == "cut_short":
        path.write_bytes(path.read_bytes()[:-1024])
    elif check == "undecodable":
        with tarfile.open(path) as tar:
            jpg = tar.extractfile(f"{key}.jpg").read()
        rewrite(path, key, undecodable(jpg))
        shards.write_index(spec)
    elif check == "bomb_swapped":  # the index kept, the shard's length too
        with tarfile.open(path) as tar:
            member = tar.getmember(f"{key}.jpg")
        data = bytearray(path.read_bytes())
        data[member.offset_data : member.offset_data + member.size] = bomb(member.size)
        path.write_bytes(bytes(data))
    elif check == "bomb":  # indexed by a latecast without the pixel limit
        rewrite(path, key, bomb())
        from latecast.kinds import jpegheader  # the one limit (too_big reads it)

        limit, jpegheader.MAX_PIXELS = jpegheader.MAX_PIXELS, 10**12
        try:
            shards.write_index(spec)
        finally:
            jpegheader.MAX_PIXELS = limit
    elif check == "label":  # a test label the train shards (classes 0..3) do not hold
        test = folder / "shard-003.tar"
        rewrite(test, "000304", label=7)
        shards.write_index(spec)
        names["file"] = f"{test}: test sample '000304'"
    return names


def run_shards_1(check, tmp_path, monkeypatch, **_) -> Said:
    monkeypatch.setattr(stream, "STAT_FILES", 4)  # as a split of 512+: no shard read whole
    spec = shards_made(tmp_path / "shards")
    names = shard_fault(check, tmp_path / "shards")

    def run() -> None:
        ds = stream.open_shards(spec, buffer=1)
        for _ in latecast.Loader(ds, 0 if check == "arguments" else 2, device="cpu"):
            pass

    return said(run, names)


def run_shards_resumed(check, tmp_path, monkeypatch, **_) -> Said:
    """9 batches read, the state kept, the fault put in, then a loader resumed from that
    state (its first read mid-shard)."""
    monkeypatch.setattr(stream, "STAT_FILES", 4)
    spec = shards_made(tmp_path / "shards")
    loader = latecast.Loader(stream.open_shards(spec, buffer=1), 2, device="cpu")
    batches = iter(loader)
    for _ in range(9):
        next(batches)
    state = loader.state_dict()
    batches.close()
    assert (state["epoch"], state["position"]) == (0, 9)
    names = shard_fault(check, tmp_path / "shards")

    def run() -> None:
        again = latecast.Loader(stream.open_shards(spec, buffer=1), 2, device="cpu")
        again.load_state_dict({**state, "batch_size": 4} if check == "arguments" else state)
        for _ in again:
            pass

    return said(run, names)


TWO_RANKS = """
import json, os, sys, warnings
import latecast
from latecast.errors import LatecastError
from latecast.storage import stream

stream.STAT_FILES = 4  # as a split of 512+: measuring reads no shard whole
out = {}
for check, spec in json.loads(sys.argv[1]).items():
    with warnings.catch_warnings(record=True) as kept:
        warnings.simplefilter("always")
        try:
            batch = 0 if check == "arguments" else 2
            for _ in latecast.Loader(stream.open_shards(spec, buffer=1), batch, device="cpu"):
                pass
            error = None
        except LatecastError as err:
            error = str(err)
    out[check] = {"error": error, "warnings": [str(w.message) for w in kept]}
with open(f"rank-{os.environ['RANK']}.json", "w") as f:
    json.dump(out, f)
"""


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> dict:
    """The 2-rank column in one ``torchrun`` launch: ``{check: ([rank 0's, rank 1's],
    names)}``, each ``{"error": line or None, "warnings": [...]}``."""
    base = tmp_path_factory.mktemp("two-ranks")
    specs, names = {}, {}
    for check in CHECKS:
        if not isinstance(TABLE[check]["shards_2"], NotApplicable):
            specs[check] = shards_made(base / check)
            names[check] = shard_fault(check, base / check)
    (base / "ranks.py").write_text(TWO_RANKS)
    runner = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    proc = subprocess.run(
        [sys.executable, *runner, "ranks.py", json.dumps(specs)], capture_output=True,
        text=True, cwd=base, timeout=TIMEOUT, env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((base / f"rank-{r}.json").read_text()) for r in (0, 1)]
    return {check: ([r[check] for r in ranks], names[check]) for check in specs}


def run_shards_2(check, two_ranks, **_) -> Said:
    """The ranks' outcome as one: each rank that met the fault said it (a sample's fault is
    met by the rank reading it alone); the other ran through."""
    ranks, names = two_ranks[check]
    if check in ("changed", "bomb", "bomb_swapped", "undecodable"):  # one sample: rank 1's first
        assert ranks[0]["error"] is None, ranks[0]["error"]  # (mid-shard)
    errors = {r["error"] for r in ranks if r["error"]}
    assert len(errors) <= 1, errors  # the ranks that meet it say the same line
    warned = sorted({w for r in ranks for w in r["warnings"]})  # each rank says it once
    return Said(errors.pop() if errors else None, warned, names)


# -- anyone's batches: wrap, jpeg_folder, Lightning -----------------------------------------------

POS = 2  # the faulty file's position in the first batch of 4


def own_files(check: str) -> tuple[list, dict]:
    """8 ``(jpeg, label)`` samples, ``check``'s fault in the one at ``POS``; labels 0..4."""
    files = [small_jpeg(20 * i) for i in range(8)]
    bad = {"cut_short": cut, "undecodable": undecodable, "bomb": lambda f: bomb()}.get(check)
    if bad is not None:
        files[POS] = bad(files[POS])
    names = {"sample": f"field 0: the file at position {POS} in the batch"}
    return [(f, i % 5) for i, f in enumerate(files)], names


def options(check: str) -> dict:
    """wrap's and the hook's: a JPEG field; for the label row a Mix of 2 classes, for the
    arguments row an option there is not."""
    from latecast.transforms import Mix

    given = dict(mean=(0.5,) * 3, std=(0.25,) * 3, fields={0: latecast.jpeg((24, 32))})
    given.update({"mix": Mix(classes=2)} if check == "label" else {})
    return {**given, **({"bogus": 1} if check == "arguments" else {})}


def run_wrap_jpeg(check, **_) -> Said:
    samples, names = own_files(check)
    dl = DataLoader(samples, batch_size=4)
    return said(lambda: list(latecast.wrap(dl, device="cpu", **options(check))), names)


def run_jpeg_folder(check, tmp_path, **_) -> Said:
    """``jpeg_folder`` of 3 class folders (the faulty file ``b/2.jpg``), a DataLoader, wrap."""
    samples, _ = own_files(check)
    root = tmp_path / "photos"
    for i, (jpg, _) in enumerate(samples):
        folder = root / "abc"[i * 3 // len(samples)]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i}.jpg").write_bytes(jpg)
    path = root / "a" / f"{POS}.jpg"
    asked = tmp_path / "no-such-folder" if check == "arguments" else root
    names = {"sample": str(path), "file": str(asked)}

    def run() -> None:
        dl = DataLoader(latecast.jpeg_folder(asked), batch_size=4)
        list(latecast.wrap(dl, device="cpu", **options("label" if check == "label" else "")))

    return said(run, names)


def run_lightning(check, tmp_path, **_) -> Said:
    """A real Lightning ``Trainer`` on the CPU fitting a tiny model through the hook."""
    pytest.importorskip("lightning")
    import lightning as L
    import torch.nn.functional as F

    from latecast.integrations.lightning import PrepareOnDevice

    samples, names = own_files(check)

    class Tiny(PrepareOnDevice, L.LightningModule):
        def __init__(self):
            super().__init__()
            self.prepare_on_device(**options(check))
            self.lin = torch.nn.Linear(3 * 24 * 32, 5)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.cross_entropy(self.lin(x.flatten(1)), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def run() -> None:
        trainer = lightning_trainer(max_epochs=1, enable_checkpointing=False,
                                    default_root_dir=tmp_path)  # fmt: skip
        trainer.fit(Tiny(), DataLoader(samples, batch_size=4))

    return said(run, names)


RUN = {
    "store": run_store, "store_cut": run_store_cut, "shards_1": run_shards_1,
    "shards_2": run_shards_2, "shards_resumed": run_shards_resumed,
    "wrap_jpeg": run_wrap_jpeg, "jpeg_folder": run_jpeg_folder, "lightning": run_lightning,
}  # fmt: skip


# the module's fixtures each path takes
NEEDS = {
    "store": ["store_files"],
    "store_cut": ["store_files", "run_cli"],
    "shards_2": ["two_ranks"],
}


def cells():
    for check in CHECKS:
        for path in PATHS:
            marks = []
            if path in ("shards_2", "store_cut", "lightning"):
                marks.append(pytest.mark.slow)  # a torchrun launch, a training run, a Trainer
            yield pytest.param(check, path, marks=marks, id=f"{check}-{path}")


@pytest.mark.parametrize(("check", "path"), list(cells()))
def test_each_check_fires_on_each_path(check, path, request, tmp_path, monkeypatch):
    """``TABLE[check][path]``: the path run over data with the check's fault in it says it
    once, as an error (nothing else after it) or a warning (the run goes on), naming it."""
    cell = TABLE[check][path]
    if isinstance(cell, NotApplicable):
        pytest.skip(f"not applicable: {cell.reason}")
    fixtures = {"tmp_path": tmp_path, "monkeypatch": monkeypatch}
    fixtures.update({name: request.getfixturevalue(name) for name in NEEDS.get(path, ())})
    out = RUN[path](check, **fixtures)
    words = [w.format(**out.names) for w in cell.words]
    if cell.kind == "error":
        assert out.error is not None, f"no error; warnings: {out.warnings}"
        assert len(out.error.splitlines()) == 1, out.error
        assert all(w in out.error for w in words), (out.error, words)
    else:
        assert out.error is None, out.error
        named = [m for m in out.warnings if all(w in m for w in words)]
        assert len(named) == 1, (out.warnings, words)


def test_the_table_has_every_cell():
    """Every check on every path: a cell that runs or says why it does not apply."""
    for check, row in TABLE.items():
        assert tuple(row) == PATHS, check
        for path, cell in row.items():
            assert isinstance(cell, (Fires, NotApplicable)), (check, path)
            assert not isinstance(cell, NotApplicable) or len(cell.reason) > 20
