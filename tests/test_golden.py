"""The same seed gives the same batches, bit for bit, as b931d8b's code: the Loader with every
mover, ``wrap`` (images, masks, integer and float fields, JPEG fields, mix, erase), ``Mover``
and the Lightning hook, the JPEG cases under each CPU decoder. The cases are
``golden/cases.py``; ``golden/make_golden.py`` saved their outputs at b931d8b."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from golden import cases

GOLDEN = Path(__file__).parent / "golden" / "b931d8b.pt"


@pytest.fixture(scope="module")
def saved() -> dict[str, list[torch.Tensor]]:
    return torch.load(GOLDEN, weights_only=True)


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> Path:
    """One folder for the module's cases: the JPEG store is converted once."""
    return tmp_path_factory.mktemp("golden")


def layout(t: torch.Tensor) -> tuple[bool, bool]:
    four = t.ndim == 4
    return t.is_contiguous(), four and t.is_contiguous(memory_format=torch.channels_last)


def assert_same(key: str, want: list[torch.Tensor], got: list[torch.Tensor]) -> None:
    assert len(got) == len(want), f"{key}: {len(got)} tensors, b931d8b gave {len(want)}"
    for k, (w, g) in enumerate(zip(want, got)):
        where = f"{key} tensor {k}"
        assert (g.dtype, g.shape) == (w.dtype, w.shape), f"{where}: {g.dtype} {tuple(g.shape)}"
        assert layout(g) == layout(w), f"{where}: memory format {layout(g)} != {layout(w)}"
        if not torch.equal(g, w):
            differ = (g != w) & ~(g.isnan() & w.isnan()) if g.is_floating_point() else g != w
            raise AssertionError(f"{where}: {int(differ.sum())} of {w.numel()} values differ")


@pytest.mark.parametrize("case", list(cases.CASES))
def test_same_batches_as_b931d8b(case, saved, shared):
    assert_same(case, saved[case], cases.run(case, shared))


@pytest.mark.parametrize("case", list(cases.JPEG_CASES))
def test_same_jpeg_batches_as_b931d8b(case, decoder, saved, shared):
    key = cases.key(case, decoder)
    assert_same(key, saved[key], cases.run(case, shared))


def test_every_saved_case_is_run(saved):
    """A case dropped from cases.py would go unchecked: the saved keys are the cases' keys."""
    assert sorted(saved) == sorted(cases.key(c, d) for c, d in cases.keys())
