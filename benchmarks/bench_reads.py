"""Lazy downstream reads (issue 12): bytes and rows an upstream Iceberg dataset gives a downstream.

Run from the repository root:

    python benchmarks/bench_reads.py                   # 5,000,000 rows in 50 files, 3 repetitions
    python benchmarks/bench_reads.py --rows 200000     # quick run
    python benchmarks/bench_reads.py --rows 1000000 --files 20 --reps 5 --only two,loop

What it does: starts an embedded Postgres under benchmarks/.work/reads/ (control plane, window
ledger, pyiceberg SQL catalog; warehouse on local disk beside it), writes the upstream dataset
`upstream` (`append_always`, 7 columns) in `--files` appends of `rows / files` rows each (one data
file per append, `seq` increasing), then runs every case in a fresh process (this script with
`--child`). "MB read" is what the child process read
(`rchar` of `/proc/self/io`: every read and pread of every thread — polars' native Parquet reader
included — metadata and imports too). The catalog of each child also reads through
`CountingFileIO` (pyiceberg's PyArrowFileIO counting the data files it opens): "FileIO opens" and
"rows read" count only data files read through pyiceberg, which since issue 36 no read of this
project does (polars reads them natively); they show that pyiceberg's reader is out of the path.

Before the cases, an upsert (merge-on-read, the default for a change spread over every file)
changes `v_int` of every 20th row: each data file then carries a positional delete file, as a
table fed by upserts does (issue 36).

Cases (issue 36: ours against polars' own Iceberg scan on the same snapshot):

- `peer_full` / `lazy_full` / `read_full`: every row and column — `pl.scan_iceberg(table,
  snapshot_id=...)` collected, `Publisher.scan(spec)` collected, `IcebergStore.read(spec)`;
- `peer_two_f` / `lazy_two_f` / `read_two_f`: 2 columns, rows with `seq` (= `id`) in the first
  10 % — the same filter on the peer and the lazy read, a window on `seq` for `IcebergStore.read`;

and (issue 12):

- `eager_two`: the old downstream read — `Publisher.read(spec)` (every column, every row) then
  `.lazy().select("id", "v_int")` — collected;
- `lazy_two`: the new one — `Publisher.scan(spec).select("id", "v_int")` — collected;
- `eager_loop`: the old read of a delta dataset over a dataset, for `--windows` windows aligned on
  the appends: per window the whole upstream, then the window filter in polars (no writes);
- `lazy_loop`: the new one: one `Publisher.scan` per run, per window `within(scan, window)` —
  the window pushed to the pyiceberg scan (no writes);
- `apply`: the real thing: a delta dataset over `upstream` applying all windows in one Dagster
  single-run backfill (ledger, compute, one commit per window); `--apply-reps` repetitions.

Reported: medians over repetitions (min-max) of seconds and bytes read, peak RSS (the child's
ru_maxrss, max over repetitions; the peer ratios also give the ratio of the repetitions' medians,
as one repetition's outlier sets the max), ratios against the eager cases measured in the same
run.

Peak RSS with the allocator's decay off (`@decay0`): the six issue-36 cases run a second time in
every repetition with `_RJEM_MALLOC_CONF=dirty_decay_ms:0,muzzy_decay_ms:0` (polars appends it to
its own jemalloc settings, `dirty_decay_ms:500,...`: the later value wins). Under polars' default,
pages a read has freed stay resident for up to 0.5 s, and how many of them are still resident when
the result is complete depends on thread timing: ±10 MB between repetitions of the same read, more
than the difference between two readers that build the same frame (a faster read even keeps more
of them). With the decay off, freed pages go back at once, and the peak measures what the read
itself holds: the same comparison with the allocator's timing taken out, on both sides alike
(`--no-decay0` skips it). Those lines also give the RSS held right after the read, with the result
frame still alive (medians): the result itself plus what the planning left behind.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

WORK = Path(__file__).resolve().parent / ".work" / "reads"
CASES = (
    "peer_full",
    "lazy_full",
    "read_full",
    "peer_two_f",
    "lazy_two_f",
    "read_two_f",
    "eager_two",
    "lazy_two",
    "eager_loop",
    "lazy_loop",
    "apply",
)
SELECTED = ("id", "v_int")
# the issue-36 comparison, also run with jemalloc's decay off (`@decay0`: see the docstring)
PEER_CASES = ("peer_full", "lazy_full", "read_full", "peer_two_f", "lazy_two_f", "read_two_f")
DECAY0 = "@decay0"
DECAY0_CONF = "dirty_decay_ms:0,muzzy_decay_ms:0"


# -- the counting FileIO (loaded by pyiceberg in the children as `__main__.CountingFileIO`) --------


def _counting_io() -> type:
    import pyarrow as pa
    from pyiceberg.io import InputFile
    from pyiceberg.io.pyarrow import PyArrowFileIO

    class _Stream:
        def __init__(self, inner: Any, location: str) -> None:
            self._inner, self._location = inner, location

        def read(self, size: int = -1) -> bytes:
            data: bytes = self._inner.read(size)
            CountingFileIO.add(self._location, len(data))
            return data

        def seek(self, offset: int, whence: int = 0) -> int:
            return int(self._inner.seek(offset, whence))

        def tell(self) -> int:
            return int(self._inner.tell())

        def close(self) -> None:
            self._inner.close()

        @property
        def closed(self) -> bool:
            return bool(self._inner.closed)

        def seekable(self) -> bool:
            return True

        def readable(self) -> bool:
            return True

        def writable(self) -> bool:
            return False

    class _Input(InputFile):
        def __init__(self, inner: InputFile) -> None:
            super().__init__(inner.location)
            self._inner = inner

        def __len__(self) -> int:
            return len(self._inner)

        def exists(self) -> bool:
            return self._inner.exists()

        def open(self, seekable: bool = True) -> Any:
            CountingFileIO.opened(self.location)
            return pa.PythonFile(_Stream(self._inner.open(seekable), self.location), mode="r")

    class CountingFileIO(PyArrowFileIO):
        bytes_read: dict[str, int] = defaultdict(int)
        opens: dict[str, int] = defaultdict(int)
        lock = threading.Lock()

        def new_input(self, location: str) -> Any:
            inner = super().new_input(location)
            return _Input(inner) if location.endswith(".parquet") else inner

        @classmethod
        def add(cls, location: str, n: int) -> None:
            with cls.lock:
                cls.bytes_read[location] += n

        @classmethod
        def opened(cls, location: str) -> None:
            with cls.lock:
                cls.opens[location] += 1

    return CountingFileIO


def __getattr__(name: str) -> Any:  # `__main__.CountingFileIO`, built on first use
    if name == "CountingFileIO":
        cls = _counting_io()
        globals()[name] = cls
        return cls
    raise AttributeError(name)


# -- environment ---------------------------------------------------------------------------------


def _env(url: str, *, counting: bool) -> dict[str, str]:
    from pipeline_output.infra.settings import to_sqlalchemy_url

    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYICEBERG_", "PIPELINE_"))}
    env.update(
        {
            "PIPELINE_OUTPUT_PG_URL": url,
            "PIPELINE_OUTPUT_HOME": str(WORK / "home"),
            "PYICEBERG_CATALOG__DEFAULT__URI": to_sqlalchemy_url(url, driver="psycopg"),
            "PYICEBERG_CATALOG__DEFAULT__WAREHOUSE": f"file://{WORK}/warehouse",
        }
    )
    if counting:
        env["PYICEBERG_CATALOG__DEFAULT__PY_IO_IMPL"] = "__main__.CountingFileIO"
    return env


def _batch(i: int, per_file: int) -> Any:
    import polars as pl

    seq = pl.int_range(i * per_file + 1, (i + 1) * per_file + 1)
    return pl.select(
        id=seq,
        seq=seq,
        k=pl.format("k{}", seq % 100_003),
        v_int=(seq * 7919) % 1_000_003,
        v_float=seq.cast(pl.Float64) / 7,
        payload=pl.concat_str(
            [seq.hash(3).cast(pl.String), pl.lit("-"), seq.hash(5).cast(pl.String)]
        ),
        ts=pl.lit(datetime(2026, 1, 1)) + pl.duration(seconds=seq),
    )


def _upstream_spec() -> Any:
    from pipeline_output import DatasetSpec

    return DatasetSpec(name="upstream", strategy="append_always")


def _setup(rows: int, files: int) -> dict[str, Any]:
    from pipeline_output.dagster_layer.resource import get_runtime

    per_file = rows // files
    store = get_runtime().iceberg
    started = time.perf_counter()
    for i in range(files):
        store.write(_upstream_spec(), _batch(i, per_file))
    # every 20th row's v_int changes: a delete file on every data file (merge-on-read)
    import polars as pl

    from pipeline_output import DatasetSpec

    keyed = DatasetSpec(name="upstream", primary_key=("id",), strategy="snapshot_replace")
    changed = pl.concat([_batch(i, per_file) for i in range(files)]).filter(pl.col("id") % 20 == 0)
    result = store.write(keyed, changed.with_columns(pl.col("v_int") + 1))
    table = store.load("upstream")
    assert table is not None
    tasks = list(table.scan().plan_files())
    paths = [t.file.file_path for t in tasks]
    return {
        "seconds": time.perf_counter() - started,
        "files": paths,
        "delete_files": sum(len(t.delete_files) for t in tasks),
        "merged_on_read": result.files_merged_on_read,
    }


def _windows(rows: int, files: int, windows: int) -> list[Any]:
    from pipeline_output import Window

    per_window = rows // windows
    return [
        Window(low=None if i == 0 else i * per_window, high=(i + 1) * per_window)
        for i in range(windows)
    ]


# -- the cases (children) -------------------------------------------------------------------------


def _child(case: str, args: argparse.Namespace) -> dict[str, Any]:
    from pipeline_output.dagster_layer.resource import get_runtime
    from pipeline_output.services.publish import ResolvedMode
    from pipeline_output.services.reads import within

    counting = sys.modules["__main__"].CountingFileIO
    runtime = get_runtime()
    publisher = runtime.publisher
    mode = ResolvedMode("iceberg", "run config")
    spec = _upstream_spec()
    windows = _windows(args.rows, args.files, args.windows)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    counting.bytes_read.clear()
    counting.opens.clear()
    out: dict[str, Any] = {}
    tenth = args.rows // 10
    rchar = _rchar()
    started = time.perf_counter()
    if case == "peer_full":
        import polars as pl

        table = runtime.iceberg.load("upstream")
        frame = pl.scan_iceberg(table, snapshot_id=table.current_snapshot().snapshot_id).collect()
        out["rows_out"] = frame.height
    elif case == "lazy_full":
        frame = publisher.scan(spec, mode=mode).collect()
        out["rows_out"] = frame.height
    elif case == "read_full":
        frame = runtime.iceberg.read(spec)
        out["rows_out"] = frame.height
    elif case == "peer_two_f":
        import polars as pl

        table = runtime.iceberg.load("upstream")
        snapshot = table.current_snapshot().snapshot_id
        frame = (
            pl.scan_iceberg(table, snapshot_id=snapshot)
            .select(*SELECTED, "seq")
            .filter(pl.col("seq") <= tenth)
            .select(*SELECTED)
            .collect()
        )
        out["rows_out"] = frame.height
    elif case == "lazy_two_f":
        import polars as pl

        lazy = publisher.scan(spec, mode=mode)
        frame = lazy.filter(pl.col("seq") <= tenth).select(*SELECTED).collect()
        out["rows_out"] = frame.height
    elif case == "read_two_f":
        from pipeline_output import Window

        window = Window(low=None, high=tenth)
        frame = runtime.iceberg.read(spec, columns=list(SELECTED), window=window, watermark="seq")
        out["rows_out"] = frame.height
    elif case == "eager_two":
        frame = publisher.read(spec, mode=mode).lazy().select(*SELECTED).collect()
        out["rows_out"] = frame.height
    elif case == "lazy_two":
        frame = publisher.scan(spec, mode=mode).select(*SELECTED).collect()
        out["rows_out"] = frame.height
    elif case == "eager_loop":
        total = 0
        for window in windows:
            eager = publisher.read(spec, mode=mode).lazy()
            part = eager.filter(window.contains("seq", eager.collect_schema()["seq"]))
            total += part.select("id", "seq", "v_int").collect().height
        out["rows_out"] = total
    elif case == "lazy_loop":
        base = publisher.scan(spec, mode=mode)
        total = 0
        for window in windows:
            total += within(base, window, "seq").select("id", "seq", "v_int").collect().height
        out["rows_out"] = total
    elif case == "apply":
        out.update(_apply(args, windows))
    else:
        raise SystemExit(f"unknown case {case}")
    out["seconds"] = time.perf_counter() - started
    out["held_mb"] = _rss_now()  # the result (`frame`) still alive
    out["rchar"] = _rchar() - rchar
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out["rss_before_mb"] = rss_before
    table = runtime.iceberg.load("upstream")
    assert table is not None
    records = {t.file.file_path: t.file.record_count for t in table.scan().plan_files()}
    out["bytes_read"] = sum(n for p, n in counting.bytes_read.items() if p in records)
    out["files_opened"] = sum(n for p, n in counting.opens.items() if p in records)
    out["rows_read"] = sum(records[p] * n for p, n in counting.opens.items() if p in records)
    return out


def _rss_now() -> float:
    """This process's resident set now, in MB (ru_maxrss's unit: KiB / 1024)."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize() / 1024 / 1024


def _rchar() -> int:
    """Bytes this process read so far (every thread: polars' native reads included)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    return 0


def _apply(args: argparse.Namespace, windows: list[Any]) -> dict[str, Any]:
    """Apply every window of a delta dataset over `upstream` in one single-run backfill."""
    import logging

    import dagster as dg
    import polars as pl

    from pipeline_output import Delta, build_definitions, dataset
    from pipeline_output.dagster_layer.resource import get_runtime

    logging.getLogger("dagster").setLevel(logging.WARNING)
    name = f"copy_{args.rep}"

    @dataset("upstream", strategy="append_always", mode="iceberg")
    def upstream() -> pl.DataFrame:
        raise RuntimeError("not materialised here")

    @dataset(
        name,
        strategy="append_always",
        mode="iceberg",
        delta=Delta(source="upstream", watermark="seq"),
    )
    def copy(upstream: pl.LazyFrame) -> pl.DataFrame:
        return upstream.select("id", "seq", "v_int").collect()

    defs = build_definitions(datasets=[upstream, copy], with_parity_checks=False)
    runtime = get_runtime()
    runtime.windows.plan(name, windows)
    keys = [w.to_key() for w in windows]
    with dg.DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions(f"{name}__windows", keys)
        job = defs.resolve_implicit_global_asset_job_def()
        result = job.execute_in_process(
            instance=instance,
            asset_selection=[dg.AssetKey(name)],
            tags={
                "dagster/asset_partition_range_start": keys[0],
                "dagster/asset_partition_range_end": keys[-1],
            },
        )
        assert result.success
    ledger = runtime.windows.windows(name)
    written = runtime.iceberg.read(name)
    ok = (
        len(ledger) == len(windows)
        and all(w.state == "applied" for w in ledger)
        and written.height == args.rows
        and written["id"].n_unique() == args.rows
    )
    return {"rows_out": written.height, "ok": ok}


# -- the parent -------------------------------------------------------------------------------------


def _chunk_bytes(paths: list[str]) -> tuple[int, int]:
    """(compressed bytes of the SELECTED columns' chunks, of all chunks) over `paths`."""
    import pyarrow.parquet as pq

    selected = everything = 0
    for path in paths:
        meta = pq.ParquetFile(path.removeprefix("file://")).metadata
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            for c in range(group.num_columns):
                chunk = group.column(c)
                everything += chunk.total_compressed_size
                if chunk.path_in_schema in SELECTED:
                    selected += chunk.total_compressed_size
    return selected, everything


def _run_child(args: argparse.Namespace, case: str, rep: int, url: str) -> dict[str, Any]:
    """Run `case` in a fresh process; `<case>@decay0` runs it with jemalloc's decay off."""
    env = _env(url, counting=True)
    if case.endswith(DECAY0):
        case = case.removesuffix(DECAY0)
        env["_RJEM_MALLOC_CONF"] = DECAY0_CONF
    cmd = [
        sys.executable,
        __file__,
        "--child",
        case,
        "--rows",
        str(args.rows),
        "--files",
        str(args.files),
        "--windows",
        str(args.windows),
        "--rep",
        str(rep),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        return {"error": f"exit {proc.returncode}: " + " | ".join(tail)}
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _mb(n: float) -> str:
    return f"{n / 1e6:,.1f}"


def _spread(values: list[float], fmt: str = "{:.3f}") -> tuple[str, str]:
    return fmt.format(
        statistics.median(values)
    ), f"{fmt.format(min(values))}-{fmt.format(max(values))}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--files", type=int, default=50, help="upstream appends (data files)")
    parser.add_argument("--windows", type=int, default=None, help="default: --files")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--apply-reps", type=int, default=None, help="default: --reps")
    parser.add_argument("--only", default="", help="comma-separated substrings of case names")
    parser.add_argument("--keep", action="store_true", help="keep benchmarks/.work/reads/")
    parser.add_argument(
        "--no-decay0",
        action="store_true",
        help="skip the second run of the issue-36 cases with jemalloc's decay off",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--rep", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.windows = args.windows or args.files
    if args.child == "setup":
        print(json.dumps(_setup(args.rows, args.files)))
        return 0
    if args.child:
        import warnings

        warnings.simplefilter("ignore")
        print(json.dumps(_child(args.child, args)))
        return 0
    if args.rows % args.files or args.rows % args.windows:
        parser.error("--rows must be a multiple of --files and of --windows")

    from pipeline_output.infra import embedded_pg

    wanted = [c for c in CASES if not args.only or any(s in c for s in args.only.split(","))]
    if not args.no_decay0:  # each issue-36 case right after itself, with the decay off
        wanted = [v for c in wanted for v in ((c, c + DECAY0) if c in PEER_CASES else (c,))]
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    wall = time.perf_counter()
    url = embedded_pg.start(data_dir=WORK / "pg")
    try:
        import polars as pl
        import pyarrow as pa
        import pyiceberg

        print("== pipeline-output benchmark: downstream reads (issues 12 and 36) ==")
        print(f"date:     {datetime.now(UTC):%Y-%m-%d %H:%M} UTC")
        print(f"machine:  {os.cpu_count()} logical cores; {platform.platform()}")
        print(
            f"python:   {sys.version.split()[0]}; polars {pl.__version__}; pyiceberg "
            f"{pyiceberg.__version__}; pyarrow {pa.__version__}"
        )
        print(f"load avg: {', '.join(f'{x:.2f}' for x in os.getloadavg())} (at start)")
        print(
            f"upstream: {args.rows:,} rows in {args.files} appends (one data file each), 7 columns "
            "(id, seq int64; k string; v_int int64; v_float float64; payload string; ts timestamp)"
        )
        print(
            f"method:   every case in a fresh process; median of {args.reps} rep(s) "
            f"(apply: {args.apply_reps or args.reps}); MB read = the process's reads (rchar)"
        )
        setup = subprocess.run(
            [
                sys.executable,
                __file__,
                "--child",
                "setup",
                "--rows",
                str(args.rows),
                "--files",
                str(args.files),
            ],
            env=_env(url, counting=False),
            capture_output=True,
            text=True,
            check=True,
        )
        info = json.loads(setup.stdout.strip().splitlines()[-1])
        selected, everything = _chunk_bytes(info["files"])
        print(
            f"setup:    {len(info['files'])} data files ({info['delete_files']} delete files) "
            f"written in {info['seconds']:.1f} s (not timed); column chunks: {_mb(everything)} "
            f"MB in all, {_mb(selected)} MB for {', '.join(SELECTED)}"
        )
        results: dict[str, list[dict[str, Any]]] = {c: [] for c in wanted}
        reps = max(args.reps, args.apply_reps or 0)
        for rep in range(1, reps + 1):
            print(f"repetition {rep}:")
            for case in wanted:
                if case == "apply" and rep > (args.apply_reps or args.reps):
                    continue
                if case != "apply" and rep > args.reps:
                    continue
                r = _run_child(args, case, rep, url)
                results[case].append(r)
                if "error" in r:
                    print(f"  {case:<18} {r['error']}")
                    continue
                print(
                    f"  {case:<18} {r['seconds']:8.3f} s  {_mb(r['bytes_read']):>9} MB via FileIO  "
                    f"{_mb(r['rchar']):>9} MB read (rchar)  {r['files_opened']:>5} files  "
                    f"peak {r['peak_rss_mb']:.0f} MB"
                )
        print()
        print("== results (medians over repetitions; peak RSS: max over repetitions) ==")
        header = (
            f"{'case':<18} {'n':>2} {'median s':>9} {'min-max s':>15} {'MB read':>9} "
            f"{'FileIO opens':>12} {'rows read':>13} {'rows read / upstream':>20} "
            f"{'peak RSS MB':>11} {'pre MB':>6}"
        )
        print(header)
        print("-" * len(header))
        med: dict[str, dict[str, float]] = {}
        for case in wanted:
            ok = [r for r in results[case] if "error" not in r]
            if not ok:
                print(
                    f"{case:<18} {0:>2} failed: {results[case][0].get('error') if results[case] else '-'}"
                )
                continue
            secs, span = _spread([r["seconds"] for r in ok])
            m = {
                "seconds": statistics.median(r["seconds"] for r in ok),
                "bytes": statistics.median(r["rchar"] for r in ok),
                "files": statistics.median(r["files_opened"] for r in ok),
                "rows": statistics.median(r["rows_read"] for r in ok),
                "rss": max(r["peak_rss_mb"] for r in ok),
                "rss_med": statistics.median(r["peak_rss_mb"] for r in ok),
                "held_med": statistics.median(r["held_mb"] for r in ok),
                "pre": max(r["rss_before_mb"] for r in ok),
            }
            med[case] = m
            print(
                f"{case:<18} {len(ok):>2} {secs:>9} {span:>15} {_mb(m['bytes']):>9} "
                f"{m['files']:>12.0f} {m['rows']:>13,.0f} {m['rows'] / args.rows:>20.2f} "
                f"{m['rss']:>11.0f} {m['pre']:>6.0f}"
            )
        print()
        print("== ratios (same-run baselines) ==")
        pairs = (
            ("lazy_full", "peer_full"),
            ("read_full", "peer_full"),
            ("lazy_two_f", "peer_two_f"),
            ("read_two_f", "peer_two_f"),
        )

        def rss_ratios(ours: str, peer: str) -> tuple[float, float]:
            """Peak RSS ours / peer: max over repetitions, and the repetitions' medians."""
            return (
                med[ours]["rss"] / med[peer]["rss"],
                med[ours]["rss_med"] / med[peer]["rss_med"],
            )

        for ours, peer in pairs:
            if ours in med and peer in med:
                t = med[ours]["seconds"] / med[peer]["seconds"]
                r, rm = rss_ratios(ours, peer)
                print(
                    f"{ours} / {peer} (pl.scan_iceberg): seconds {t:.3f} "
                    f"({'meets' if t <= 1.0 else 'MISSES'} <= 1.0), peak RSS {r:.3f} "
                    f"({'meets' if r <= 1.0 else 'MISSES'} <= 1.0; median of reps {rm:.3f})"
                )
        for ours, peer in pairs:
            ours, peer = ours + DECAY0, peer + DECAY0
            if ours in med and peer in med:
                peak, peak_med = rss_ratios(ours, peer)
                print(
                    f"{ours} / {peer} (decay off): peak RSS {peak:.3f} "
                    f"({'meets' if peak <= 1.0 else 'MISSES'} <= 1.0; median of reps "
                    f"{peak_med:.3f}, {med[ours]['rss_med'] - med[peer]['rss_med']:+.1f} MB); "
                    f"RSS held with the result alive {med[ours]['held_med']:.1f} vs "
                    f"{med[peer]['held_med']:.1f} MB "
                    f"({med[ours]['held_med'] - med[peer]['held_med']:+.1f} MB, medians)"
                )
        if "eager_two" in med and "lazy_two" in med:
            e, lz = med["eager_two"], med["lazy_two"]
            print(
                f"select {len(SELECTED)} of 7 columns: bytes read lazy / eager          "
                f"{lz['bytes'] / e['bytes']:.3f}  (column chunks {', '.join(SELECTED)} / all: "
                f"{selected / everything:.3f})"
            )
            print(
                f"select {len(SELECTED)} of 7 columns: peak RSS lazy / eager            "
                f"{lz['rss'] / e['rss']:.3f}  (above the pre-read RSS: "
                f"{lz['rss'] - lz['pre']:.0f} MB vs {e['rss'] - e['pre']:.0f} MB)"
            )
            print(
                f"select {len(SELECTED)} of 7 columns: seconds lazy / eager             "
                f"{lz['seconds'] / e['seconds']:.3f}"
            )
        for case in ("eager_loop", "lazy_loop", "apply"):
            if case in med:
                print(
                    f"{args.windows} windows, {case:<10}: upstream rows read / upstream rows "
                    f"{med[case]['rows'] / args.rows:.2f}"
                )
        if "eager_loop" in med and "lazy_loop" in med:
            e, lz = med["eager_loop"], med["lazy_loop"]
            print(
                f"{args.windows} windows: seconds lazy_loop / eager_loop                "
                f"{lz['seconds'] / e['seconds']:.3f}; peak RSS {lz['rss'] / e['rss']:.3f}"
            )
        if "apply" in results:
            checks = all(r.get("ok") for r in results["apply"] if "error" not in r)
            print(
                f"apply checks (every window applied, every upstream row once): "
                f"{'ok' if checks else 'FAILED'}"
            )
        print(
            f"\nload avg at end: {', '.join(f'{x:.2f}' for x in os.getloadavg())}; wall time "
            f"{time.perf_counter() - wall:.0f} s"
        )
        return 0
    finally:
        embedded_pg.stop(data_dir=WORK / "pg")
        if not args.keep:
            shutil.rmtree(WORK, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
