"""The project's Dagster definitions (`pipeline_output.definitions:defs`, loaded by workspace.yaml).

A placeholder asset until the demo datasets land.
"""

from __future__ import annotations

import dagster as dg


@dg.asset
def hello() -> dg.MaterializeResult[None]:
    """A trivial asset: proves the code location loads and runs are recorded."""
    squares = [n * n for n in range(10)]
    return dg.MaterializeResult(metadata={"rows": len(squares), "sum": sum(squares)})


defs = dg.Definitions(assets=[hello])
