"""The same seed gives the same batches, bit for bit, as the code they were saved from: the
Loader with every mover, ``wrap`` (images, masks, integer and float fields, JPEG fields, mix,
erase), ``Mover`` and the Lightning hook, the JPEG cases under each CPU decoder, as b931d8b gave
them (``b931d8b.pt``); the kinds added since (16-bit images and stores, audio, clips, the
Lightning hook's packed batches) as a755c18 gave them (``a755c18.pt``). The cases are
``golden/cases.py``; ``golden/make_golden.py`` saves their outputs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from golden import cases

GOLDEN = Path(__file__).parents[1] / "golden"


@pytest.fixture(scope="module")
def saved() -> dict[str, list[torch.Tensor]]:
    files = [torch.load(GOLDEN / f"{rev}.pt", weights_only=True) for rev in ("b931d8b", "a755c18")]
    return {**files[0], **files[1]}


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> Path:
    """One folder for the module's cases: the JPEG store is converted once."""
    return tmp_path_factory.mktemp("golden")


def layout(t: torch.Tensor) -> tuple[bool, bool]:
    four = t.ndim == 4
    return t.is_contiguous(), four and t.is_contiguous(memory_format=torch.channels_last)


def assert_same(key: str, want: list[torch.Tensor], got: list[torch.Tensor]) -> None:
    assert len(got) == len(want), f"{key}: {len(got)} tensors, {len(want)} saved"
    for k, (w, g) in enumerate(zip(want, got)):
        where = f"{key} tensor {k}"
        assert (g.dtype, g.shape) == (w.dtype, w.shape), f"{where}: {g.dtype} {tuple(g.shape)}"
        assert layout(g) == layout(w), f"{where}: memory format {layout(g)} != {layout(w)}"
        if not torch.equal(g, w):
            differ = (g != w) & ~(g.isnan() & w.isnan()) if g.is_floating_point() else g != w
            raise AssertionError(f"{where}: {int(differ.sum())} of {w.numel()} values differ")


@pytest.mark.parametrize("case", [*cases.CASES, *cases.SINCE])
def test_same_batches(case, saved, shared):
    assert_same(case, saved[case], cases.run(case, shared))


@pytest.mark.parametrize("case", [*cases.JPEG_CASES, *cases.JPEG_SINCE])
def test_same_jpeg_batches(case, decoder, saved, shared):
    key = cases.key(case, decoder)
    assert_same(key, saved[key], cases.run(case, shared))


def test_every_saved_case_is_run(saved):
    """A case dropped from cases.py would go unchecked: the saved keys are the cases' keys."""
    assert sorted(saved) == sorted(cases.key(c, d) for c, d in cases.keys() + cases.since())
