"""``latecast.jpeg_folder`` is ``ImageFolder`` with the files left encoded: its classes and
samples are ImageFolder's on any tree, in its order, and a file that is no regular file, is
empty or does not read is one error naming its path."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
from _helpers import noise_jpeg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

import latecast
from latecast.errors import FormatError

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
    """A FIFO named ``*.jpg`` (whose reading waits for a writer: it hung) and a device are
    refused by their type, never opened; an empty file (named by its position in a shuffled
    batch) and a link to nothing (a raw OSError) are one ``FormatError`` naming the path."""
    rng = np.random.default_rng(0)
    (tmp_path / "a").mkdir()
    for i in range(3):
        (tmp_path / "a" / f"{i}.jpg").write_bytes(noise_jpeg(rng))
    bad = {"pipe.jpg": "not a regular file", "zeros.jpg": "not a regular file"}
    bad |= {"empty.jpg": "empty file", "gone.jpg": "cannot read it (No such file or directory)"}
    os.mkfifo(tmp_path / "a" / "pipe.jpg")
    (tmp_path / "a" / "zeros.jpg").symlink_to("/dev/zero")
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
    (tmp_path / "a" / "pipe.jpg").unlink()
    (tmp_path / "a" / "zeros.jpg").unlink()
    (tmp_path / "a" / "gone.jpg").unlink()
    loader = DataLoader(latecast.jpeg_folder(tmp_path), 2, shuffle=True)
    with pytest.raises(FormatError, match=f"^{tmp_path / 'a' / 'empty.jpg'}: empty file$"):
        for _ in latecast.wrap(loader, device="cpu"):
            pass
