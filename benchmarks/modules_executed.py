"""How many of the package's modules one upsert materialised through Dagster executes (issue 43).

Run from the repository root:

    python3 benchmarks/modules_executed.py            # prints the count, the target and the list
    python3 benchmarks/modules_executed.py --quiet    # the count lines only

What it does: starts an embedded Postgres in a temporary directory, defines one keyed dataset
(`strategy="snapshot_replace"`, `mode="iceberg"`) the way a user's `definitions.py` does, and
materialises it twice through Dagster (`dg.materialize`, in process): the first run creates the
table, the second upserts (a tenth of the rows changed, a tenth new). Only the second run is
watched: a profiler (`sys.setprofile` in every thread) records each module of `pipeline_output`
whose code runs during it — a function called, or a module body imported then. That is the
code a reader follows to understand an upsert; the issue's target is at most 35 modules.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import warnings
from pathlib import Path
from types import FrameType
from typing import Any

TARGET = 35
REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args()
    warnings.simplefilter("ignore")

    import dagster as dg
    import polars as pl

    import pipeline_output
    from pipeline_output import build_definitions, dataset
    from pipeline_output.infra import embedded_pg

    package = Path(pipeline_output.__file__).parent
    home = Path(tempfile.mkdtemp(prefix="modules-executed-"))
    url = embedded_pg.start(data_dir=home / "pg")
    try:
        os.environ["PIPELINE_OUTPUT_PG_URL"] = url
        os.environ["PIPELINE_OUTPUT_HOME"] = str(home / "home")
        rows = {"n": 0}

        @dataset(primary_key="id", strategy="snapshot_replace", mode="iceberg")
        def customers() -> pl.DataFrame:
            n = 10_000
            shift = rows["n"]
            return pl.DataFrame(
                {
                    "id": range(shift, shift + n),
                    "name": [f"c{i % 97}" for i in range(n)],
                    "score": [float(i % 13 + (shift and i % 10 == 0)) for i in range(n)],
                }
            )

        defs = build_definitions(assets=[customers])
        instance = dg.DagsterInstance.ephemeral()
        first = dg.materialize([customers], resources=defs.resources, instance=instance)
        assert first.success
        rows["n"] = 1_000  # a tenth new ids, a tenth of the rest changed

        seen: set[str] = set()
        root = str(package)

        def profile(frame: FrameType, event: str, arg: Any) -> None:
            if event == "call":
                filename = frame.f_code.co_filename
                if filename.startswith(root):
                    seen.add(filename)

        sys.setprofile(profile)
        threading.setprofile(profile)
        try:
            second = dg.materialize([customers], resources=defs.resources, instance=instance)
        finally:
            sys.setprofile(None)
            threading.setprofile(None)  # type: ignore[arg-type]
        assert second.success
    finally:
        embedded_pg.stop(data_dir=home / "pg")
        shutil.rmtree(home, ignore_errors=True)

    total = sorted(p for p in package.rglob("*.py") if "__pycache__" not in p.parts)
    executed = sorted(Path(f).relative_to(package).as_posix() for f in seen)
    print(f"modules executed by one upsert through Dagster: {len(executed)} of {len(total)}")
    print(f"target: <= {TARGET}: {'met' if len(executed) <= TARGET else 'NOT met'}")
    if not args.quiet:
        for name in executed:
            print(f"  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
