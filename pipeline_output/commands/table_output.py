"""Plain-text tables for the commands that print one (`history`, `audit show`, `maintain`)."""

from __future__ import annotations

from collections.abc import Sequence

import click


def echo_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Columns padded to their widest cell, trailing spaces trimmed."""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    for row in [header, *rows]:
        click.echo("  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=False)).rstrip())
