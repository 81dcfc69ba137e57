"""``latecast.jpeg_folder`` is ``ImageFolder`` with the files left encoded: its classes and
samples are ImageFolder's on any tree, in its order; a file that is no regular file, is
empty or does not read is one error naming its path; a batch read as one buffer gives the
batches of reading each sample alone."""

from __future__ import annotations

import os
import re
import socket
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from _helpers import jpeg_bytes, noise_jpeg, smooth
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, DistributedSampler

import latecast
from latecast.errors import FormatError
from latecast.storage.folder import JpegFolder

ImageFolder = pytest.importorskip("torchvision.datasets").ImageFolder

# Names as people make them: hidden, upper case, unicode, spaces; "-" sorts before "/", so
# "a-b" comes between the folders "a" and "a/b" where paths are sorted as strings.
NAMES = st.text("aB.-_ é猫", min_size=1, max_size=4).filter(lambda n: n not in (".", ".."))
SUFFIXES = [".jpg"] * 4 + [".JPG", ".jpeg", ".Png", ".webp", ".TIFF", ".gif", ".txt", ".jpg~", ""]
FILES = st.builds(str.__add__, NAMES, st.sampled_from(SUFFIXES))
# a tree: {name: b"" (a file) or a tree (a folder)}
TREES = st.recursive(
    st.dictionaries(FILES, st.just(b""), max_size=3),
    lambda trees: st.dictionaries(st.one_of(NAMES, FILES), trees | st.just(b""), max_size=4),
    max_leaves=16,
)


def make(folder: Path, tree: dict) -> None:
    folder.mkdir()
    for name, child in tree.items():
        make(folder / name, child) if isinstance(child, dict) else (folder / name).write_bytes(b"")


def listing(make_dataset) -> tuple | None:
    """``(classes, class_to_idx, samples, targets)``, or None where it refuses the tree."""
    try:
        ds = make_dataset()
    except (FileNotFoundError, FormatError):  # ImageFolder's refusal, latecast's
        return None
    return ds.classes, ds.class_to_idx, ds.samples, ds.targets


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inside=TREES, outside=TREES, data=st.data())
def test_its_samples_are_image_folders_on_any_tree(inside, outside, data):
    """Random trees: nested folders, hidden files and folders, odd and upper-case suffixes,
    unicode names, and symlinks (to folders and files outside the root, to files inside it,
    a class that is a link, a link to nothing)."""
    with tempfile.TemporaryDirectory() as tmp:
        root, away = Path(tmp, "root"), Path(tmp, "away")
        make(root, inside)
        make(away, outside)
        folders = [root, *sorted(p for p in root.rglob("*") if p.is_dir())]
        files = sorted(p for p in root.rglob("*.jpg") if not p.is_dir())  # a folder: a loop
        targets = [away, *sorted(away.rglob("*")), *files, root / "gone"]
        for _ in range(data.draw(st.integers(0, 4))):  # links never point at a folder above
            link = data.draw(st.sampled_from(folders)) / data.draw(st.one_of(NAMES, FILES))
            if not os.path.lexists(link):
                link.symlink_to(data.draw(st.sampled_from(targets)))
        want = listing(lambda: ImageFolder(str(root)))
        assert listing(lambda: latecast.jpeg_folder(root)) == want
        assert listing(lambda: latecast.jpeg_folder(str(root) + "/")) == want


def test_a_link_back_to_a_folder_above_is_one_error_where_image_folder_never_ends(tmp_path):
    """A class folder holding a link to itself or to a folder above it: ``os.walk`` with
    ``followlinks=True`` (ImageFolder's) walks it until memory or the recursion limit runs
    out (10 GB seen in a run of the property test above before its trees left loops out)."""
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "x.jpg").write_bytes(b"\xff\xd8\xff")
    (tmp_path / "a" / "b" / "up").symlink_to(tmp_path / "a")
    with pytest.raises(FormatError, match=r"a/b/up: a link back to .*/a, a folder it is in"):
        latecast.jpeg_folder(tmp_path)
    (tmp_path / "a" / "b" / "up").unlink()
    (tmp_path / "a" / "b" / "side").symlink_to(tmp_path / "a" / "b")  # itself
    with pytest.raises(FormatError, match="a link back to"):
        latecast.jpeg_folder(tmp_path)


def test_a_file_that_is_not_regular_empty_or_unreadable_is_named_by_its_path(tmp_path):
    """A FIFO named ``*.jpg`` (whose reading waits for a writer: it hung), a device and a
    socket are refused by their type, never read; an empty file (named by its position in a shuffled
    batch) and a link to nothing (a raw OSError) are one ``FormatError`` naming the path."""
    rng = np.random.default_rng(0)
    (tmp_path / "a").mkdir()
    for i in range(3):
        (tmp_path / "a" / f"{i}.jpg").write_bytes(noise_jpeg(rng))
    bad = {"pipe.jpg": "not a regular file", "zeros.jpg": "not a regular file"}
    bad |= {"sock.jpg": "not a regular file (a socket)"}
    bad |= {"empty.jpg": "empty file", "gone.jpg": "cannot read it (No such file or directory)"}
    os.mkfifo(tmp_path / "a" / "pipe.jpg")
    (tmp_path / "a" / "zeros.jpg").symlink_to("/dev/zero")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "a" / "sock.jpg"))  # a socket's file: open() refuses it
    (tmp_path / "a" / "empty.jpg").write_bytes(b"")
    (tmp_path / "a" / "gone.jpg").symlink_to(tmp_path / "nowhere.jpg")
    folder = latecast.jpeg_folder(tmp_path)
    paths = [path for path, _ in folder.samples]
    # Held open for writing here, so that code opening the FIFO gets an empty read at once
    # instead of waiting forever for a writer.
    fd = os.open(tmp_path / "a" / "pipe.jpg", os.O_RDWR)
    try:
        for name, why in bad.items():
            path = str(tmp_path / "a" / name)
            with pytest.raises(FormatError) as err:
                folder[paths.index(path)]
            assert str(err.value).startswith(f"{path}: {why}"), err.value
    finally:
        os.close(fd)
    sock.close()
    (tmp_path / "a" / "sock.jpg").unlink()
    (tmp_path / "a" / "pipe.jpg").unlink()
    (tmp_path / "a" / "zeros.jpg").unlink()
    (tmp_path / "a" / "gone.jpg").unlink()
    loader = DataLoader(latecast.jpeg_folder(tmp_path), 2, shuffle=True)
    with pytest.raises(FormatError, match=f"^{tmp_path / 'a' / 'empty.jpg'}: empty file$"):
        for _ in latecast.wrap(loader, device="cpu"):
            pass


class OneByOne(JpegFolder):
    """``jpeg_folder`` as it was: the DataLoader reads each sample alone (no ``__getitems__``)."""

    __getitems__ = None


def test_a_batch_read_as_one_buffer_gives_the_batches_of_one_read_a_sample(tmp_path):
    """``__getitems__``: a batch's files joined in one buffer in 2 workers; through ``wrap``
    the same batches, bit for bit, as each sample read alone, shuffled, cut by ``drop_last``,
    under a sampler and a distributed one; a ``collate_fn`` of one's own and ``batch_size=None``
    are given ``(bytes, label)`` samples; a file that does not read is named by its path."""
    for i in range(11):
        (tmp_path / "abc"[i % 3]).mkdir(exist_ok=True)
        (tmp_path / "abc"[i % 3] / f"{i}.jpg").write_bytes(jpeg_bytes(smooth(12, 12, i)))
    folder, alone = latecast.jpeg_folder(tmp_path), OneByOne(tmp_path)
    aug = latecast.Augment(crop=2, flip=0.5)

    def batches(ds, sampler=None, **how) -> list[torch.Tensor]:
        sampler = sampler and (sampler(ds) if callable(sampler) else sampler)
        seeded = torch.Generator().manual_seed(0)
        dl = DataLoader(ds, 4, num_workers=2, sampler=sampler, generator=seeded, **how)
        return [torch.cat(t) for t in zip(*latecast.wrap(dl, device="cpu", augment=aug))]

    def distributed(ds) -> DistributedSampler:  # rank 1 of 2, each loader its own
        return DistributedSampler(ds, 2, 1, seed=3)

    shuffled = {"shuffle": True}
    for how in (shuffled, shuffled | {"drop_last": True}, {"sampler": [7, 2, 9]}):
        assert all(map(torch.equal, batches(folder, **how), batches(alone, **how))), how
    assert all(map(torch.equal, batches(folder, distributed), batches(alone, distributed)))
    files, labels = next(iter(DataLoader(folder, 3)))
    samples = [folder[i] for i in range(3)]
    assert type(files).__name__ == "Files" and labels.dtype == torch.int64
    assert list(zip(files, labels.tolist())) == samples
    assert next(iter(DataLoader(folder, 3, collate_fn=list))) == samples
    assert list(next(iter(DataLoader(folder, None)))) == list(folder[0])
    (tmp_path / "b" / "gone.jpg").symlink_to(tmp_path / "nowhere.jpg")
    with pytest.raises(FormatError, match=re.escape(f"{tmp_path / 'b' / 'gone.jpg'}: cannot read")):
        list(DataLoader(latecast.jpeg_folder(tmp_path), 4, num_workers=2))


def test_a_batch_read_as_one_buffer_moves_alike_through_wrap_a_mover_and_the_lightning_hook(
    tmp_path,
):
    """The ``Files`` batch is recognised by the one ``plan`` on every way in: ``wrap``, a
    ``Mover`` and ``PrepareOnDevice`` under a real ``Trainer`` give the same batches, plain
    lists (a list type of the worker pipe's, kept, broke Lightning's clone of the batch)."""
    from _helpers import hooked_fit

    for i in range(8):
        (tmp_path / "ab"[i % 2]).mkdir(exist_ok=True)
        (tmp_path / "ab"[i % 2] / f"{i}.jpg").write_bytes(jpeg_bytes(smooth(12, 12, i)))
    loader = DataLoader(latecast.jpeg_folder(tmp_path), 4)  # in order: the same batches
    aug = latecast.Augment(crop=2, flip=0.5)
    want = list(latecast.wrap(loader, device="cpu", augment=aug))
    seen = hooked_fit(loader, trainer=dict(max_steps=2), augment=aug).trained
    mover = latecast.Mover(device="cpu", augment=aug)
    assert len(want) == len(seen) == 2 and all(type(b) is list for b in want)  # as collated
    for ref, hooked, moved in zip(want, seen, map(mover, loader)):
        assert all(map(torch.equal, ref, hooked)) and all(map(torch.equal, ref, moved))
