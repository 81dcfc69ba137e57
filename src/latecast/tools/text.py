"""What the command line and ``latecast doctor`` both print with. Imports nothing of torch:
the command line starts without it."""

from __future__ import annotations


def human_bytes(n: float) -> str:
    """``n`` bytes in decimal units: ``512 B``, ``50.2 KB``, ``1.3 GB``."""
    for unit in ("B", "KB", "MB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def markdown_table(header: list[str], rows: list[list], pad: bool = False) -> str:
    """A markdown table; ``pad``: each column padded to its widest cell (for a terminal)."""
    cells = [header, *([str(c) for c in r] for r in rows)]
    widths = [max(len(r[i]) for r in cells) if pad else 0 for i in range(len(header))]
    rule = "|".join("-" * (w + 2) if pad else "---" for w in widths)
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in cells]
    return "\n".join([lines[0], f"|{rule}|", *lines[1:]])
