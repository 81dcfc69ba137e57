"""The same seed gives the same batches, bit for bit, as the code they were saved from
(``golden/cases.py``, saved by ``golden/make_golden.py``): every way in as b931d8b gave them,
the kinds added since as a755c18 did. One case changed on purpose (``issue47.pt``): the
Lightning hook draws no waveform crop in evaluation, so ``lightning-audio/packed``'s
evaluation pass comes out centred (``test_issue_47_changed_only_the_evaluation_pass``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from golden import cases

GOLDEN = Path(__file__).parents[1] / "golden"


@pytest.fixture(scope="module")
def saved() -> dict[str, list[torch.Tensor]]:
    revs = ("b931d8b", "a755c18", "issue47")
    files = [torch.load(GOLDEN / f"{rev}.pt", weights_only=True) for rev in revs]
    assert set(files[2]) <= set(files[1])  # a case changed on purpose, not one added
    return {**files[0], **files[1], **files[2]}


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


def test_issue_47_changed_only_the_evaluation_pass():
    """``issue47.pt``'s ``lightning-audio/packed`` is a755c18's but for the audio of its
    evaluation pass (the last third: two batches of audio, lengths, labels)."""
    old, new = (torch.load(GOLDEN / f"{rev}.pt", weights_only=True)["lightning-audio/packed"]
                for rev in ("a755c18", "issue47"))  # fmt: skip
    assert len(old) == len(new) == 18
    differ = [k for k, (a, b) in enumerate(zip(old, new)) if not torch.equal(a, b)]
    assert differ == [12, 15]
