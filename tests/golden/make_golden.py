"""Save the golden cases' outputs from the code on PYTHONPATH: at b931d8b ``b931d8b.pt``
(``cases.keys()``), at a755c18 with ``--since`` ``a755c18.pt`` (``cases.since()``).

    PYTHONPATH=src python tests/golden/make_golden.py [--since] [OUT]

The file is ``torch.save`` of ``{key: [tensors]}``, equal tensors saved once.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import cases  # noqa: E402


def use_decoder(name: str) -> str:
    """Make ``name`` this process's CPU JPEG decoder, as the suite's ``decoder`` fixture does;
    returns the one latecast reports."""
    from latecast.kinds import decode

    if name == "simplejpeg":
        os.environ.pop("LATECAST_DECODER", None)
    else:
        os.environ["LATECAST_DECODER"] = name
    decode.decoder.cache_clear(), decode.cpu_decoder.cache_clear()
    return decode.cpu_decoder()


def identity(t: torch.Tensor) -> tuple:
    """What makes two outputs the same tensor: dtype, shape, strides and bytes."""
    raw = t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
    return t.dtype, t.shape, t.stride(), hashlib.sha256(raw).digest()


def main(out: Path, since: bool) -> None:
    saved, seen = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for case, decoder in cases.since() if since else cases.keys():
            if decoder is not None:
                chosen = use_decoder(decoder)
                assert chosen.startswith(decoder), (decoder, chosen)
            outputs = cases.run(case, Path(tmp))
            key = cases.key(case, decoder)
            saved[key] = [seen.setdefault(identity(t), t) for t in outputs]  # saved once
    torch.save(saved, out)
    print(f"{out}: {len(saved)} cases, {len(seen)} distinct tensors, {out.stat().st_size} bytes")


if __name__ == "__main__":
    since = "--since" in sys.argv
    args = [a for a in sys.argv[1:] if a != "--since"]
    default = Path(__file__).parent / ("a755c18.pt" if since else "b931d8b.pt")
    main(Path(args[0]) if args else default, since)
