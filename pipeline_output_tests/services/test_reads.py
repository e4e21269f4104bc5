"""Lazy downstream reads (issue 12): projection and filter pushdown on both arms, measured.

Real parts only: the session's Postgres, a pyiceberg SQL catalog on it, in-process Dagster runs.
What each read touched is measured outside the code under test:

- Iceberg: data files are read by polars' native reader (not through pyiceberg's FileIO): the
  bytes the process read (`rchar` of `/proc/self/io`, every read and pread) are counted around
  the downstream run, and the files a window read must not open are moved away while it runs
  (opening one fails the run); the catalog still reads its metadata through `CountingFileIO`
  (pyiceberg's `PyArrowFileIO` counting bytes per file), which must see no data file read;
- Postgres: `log_statement = 'all'` on the test database; the statements the server logged are
  read back from its log file (`pg_read_file`), their columns listed, and each re-executed to count
  the rows it returned.

Every result is compared with an independent polars oracle built from the inputs.
"""

from __future__ import annotations

import re
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import polars as pl
import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from psycopg import sql
from pyiceberg.io import InputFile
from pyiceberg.io.pyarrow import PyArrowFileIO

from pipeline_output import Delta, Window, build_definitions, dataset
from pipeline_output.dagster_layer.resource import get_runtime, reset_runtime
from pipeline_output.infra.settings import to_sqlalchemy_url, with_database
from pipeline_output_tests.oracle import assert_same_multiset

# --- measuring Iceberg reads: a FileIO that counts bytes read from Parquet data files -------------


class _CountingStream:
    """A file object over pyiceberg's input stream that reports every read's length."""

    def __init__(self, inner: Any, location: str) -> None:
        self._inner = inner
        self._location = location

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


class _CountingInput(InputFile):
    def __init__(self, inner: InputFile) -> None:
        super().__init__(inner.location)
        self._inner = inner

    def __len__(self) -> int:
        return len(self._inner)

    def exists(self) -> bool:
        return self._inner.exists()

    def open(self, seekable: bool = True) -> Any:
        CountingFileIO.opened(self.location)
        return pa.PythonFile(_CountingStream(self._inner.open(seekable), self.location), mode="r")


class CountingFileIO(PyArrowFileIO):
    """pyiceberg's PyArrowFileIO; reads of `.parquet` files are counted (bytes and opens)."""

    bytes_read: dict[str, int] = defaultdict(int)
    opens: dict[str, int] = defaultdict(int)
    _lock = threading.Lock()

    def new_input(self, location: str) -> Any:
        inner = super().new_input(location)
        return _CountingInput(inner) if location.endswith(".parquet") else inner

    @classmethod
    def add(cls, location: str, n: int) -> None:
        with cls._lock:
            cls.bytes_read[location] += n

    @classmethod
    def opened(cls, location: str) -> None:
        with cls._lock:
            cls.opens[location] += 1

    @classmethod
    def reset(cls) -> None:
        with cls._lock:
            cls.bytes_read.clear()
            cls.opens.clear()


# --- measuring Postgres reads: the statements the server logged ----------------------------------


class StatementLog:
    """The statements the server logs for the test database (`log_statement = 'all'`)."""

    def __init__(self, pg_url: str, db_url: str) -> None:
        self.admin = with_database(pg_url, database="postgres")
        self.db_url = db_url
        with psycopg.connect(self.admin, autocommit=True) as conn:
            row = conn.execute("SELECT (pg_stat_file('log', true)).size").fetchone()
            if row is None or row[0] is None:
                pytest.skip("the server's log file is not readable here (not the embedded server)")
        with psycopg.connect(db_url, autocommit=True) as conn:
            name = conn.execute("SELECT current_database()").fetchone()
            assert name is not None
            conn.execute(
                sql.SQL("ALTER DATABASE {} SET log_statement = 'all'").format(
                    sql.Identifier(name[0])
                )
            )
        self._offset = self._size()

    def _size(self) -> int:
        with psycopg.connect(self.admin, autocommit=True) as conn:
            row = conn.execute("SELECT (pg_stat_file('log')).size").fetchone()
        assert row is not None
        return int(row[0])

    def mark(self) -> None:
        """Forget what was logged so far."""
        self._offset = self._size()

    def reads_of(self, dataset: str) -> list[str]:
        """The row reads of `dataset` logged since `mark`: the SELECTs on `dataset_rows`."""
        time.sleep(0.05)
        end = self._size()
        with psycopg.connect(self.admin, autocommit=True) as conn:
            row = conn.execute(
                "SELECT pg_read_file('log', %s, %s)", (self._offset, end - self._offset)
            ).fetchone()
        assert row is not None
        text = str(row[0])
        out = []
        for match in re.finditer(r"COPY \((SELECT .*?)\) TO STDOUT", text):
            query = match.group(1)
            if '"dataset_rows"' in query and f"r.dataset_id = '{dataset}'" in query:
                out.append(query)
        return out

    @staticmethod
    def columns(query: str) -> set[str]:
        """The columns a logged read selects (its `AS "name"` aliases before FROM)."""
        select = query.split(" FROM ", 1)[0]
        return set(re.findall(r'AS "([^"]+)"', select))

    def rows(self, query: str) -> int:
        """How many rows a logged read returns (re-executed as logged, on a UTC session)."""
        with psycopg.connect(self.db_url, autocommit=True) as conn:
            conn.execute("SET TimeZone = 'UTC'")
            return len(conn.execute(query).fetchall())  # type: ignore[call-overload]


# --- fixtures -------------------------------------------------------------------------------------


@pytest.fixture
def env(
    settings_env: Any, pg_db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """The runtime on a fresh database, its catalog reading through `CountingFileIO`."""
    prefix = "PYICEBERG_CATALOG__DEFAULT__"
    monkeypatch.setenv(prefix + "URI", to_sqlalchemy_url(pg_db_url, driver="psycopg"))
    monkeypatch.setenv(prefix + "WAREHOUSE", f"file://{tmp_path}/warehouse")
    monkeypatch.setenv(prefix + "PY_IO_IMPL", f"{__name__}.CountingFileIO")
    reset_runtime()
    get_runtime()
    CountingFileIO.reset()
    yield pg_db_url
    reset_runtime()


@pytest.fixture
def statements(env: str, pg_url: str) -> StatementLog:
    return StatementLog(pg_url, env)


def _materialize(
    defs: dg.Definitions, instance: dg.DagsterInstance, name: str, partition: str | None = None
) -> None:
    job = defs.resolve_implicit_global_asset_job_def()
    result = job.execute_in_process(
        instance=instance, asset_selection=[dg.AssetKey(name)], partition_key=partition
    )
    assert result.success


def _data_files(name: str) -> dict[str, int]:
    """Data file path -> record count of dataset `name`'s current Iceberg snapshot."""
    table = get_runtime().iceberg.load(name)
    assert table is not None
    return {t.file.file_path: t.file.record_count for t in table.scan().plan_files()}


def _chunk_bytes(path: str, columns: set[str] | None = None) -> int:
    """Compressed bytes of the column chunks of `columns` (None: all) in one Parquet file."""
    meta = pq.ParquetFile(path.removeprefix("file://")).metadata
    total = 0
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for c in range(group.num_columns):
            chunk = group.column(c)
            if columns is None or chunk.path_in_schema in columns:
                total += chunk.total_compressed_size
    return total


def _arm_rows(name: str, arm: str) -> pl.DataFrame:
    runtime = get_runtime()
    return runtime.iceberg.read(name) if arm == "iceberg" else runtime.postgres.read(name)


# --- a downstream asset selecting 2 columns of a 6-column upstream --------------------------------

ROWS = 100_000


def wide_rows() -> pl.DataFrame:
    """6 columns; `payload` (200 digits, distinct per row) dominates the bytes."""
    ids = pl.int_range(0, ROWS)
    return pl.select(
        id=ids,
        name=pl.format("n{}", ids % 1000),
        score=ids.cast(pl.Float64) / 7,
        payload=pl.concat_str(
            [(ids * 7919 + k).hash(k).cast(pl.String).str.pad_start(25, "0") for k in range(8)]
        ),
        flag=ids % 3 == 0,
        day=pl.lit(date(2024, 1, 1)) + pl.duration(days=ids % 365),
    )


def narrow_defs(arm: str) -> dg.Definitions:
    @dataset("wide", primary_key="id", mode=arm)  # type: ignore[arg-type]
    def wide() -> pl.DataFrame:
        return wide_rows()

    @dataset("narrow", primary_key="id", mode=arm)  # type: ignore[arg-type]
    def narrow(wide: pl.LazyFrame) -> pl.LazyFrame:
        return wide.select("id", "name")

    return build_definitions(datasets=[wide, narrow], with_parity_checks=False)


def _bytes_read() -> int:
    """Bytes this process has read so far (every thread; read and pread, files and pipes)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


def test_iceberg_downstream_reads_only_the_two_selected_columns(env, instance):
    defs = narrow_defs("iceberg")
    _materialize(defs, instance, "wide")
    files = _data_files("wide")
    CountingFileIO.reset()

    before = _bytes_read()
    _materialize(defs, instance, "narrow")
    total_read = _bytes_read() - before

    assert not [p for p in CountingFileIO.opens if p in files]  # polars read them, natively
    selected = sum(_chunk_bytes(p, {"id", "name"}) for p in files)
    everything = sum(_chunk_bytes(p) for p in files)
    assert everything > 10 * selected  # the data makes the difference unmistakable
    # the selected column chunks, footers, and whatever else the run read (metadata, logs):
    # never the other four columns' chunks
    assert total_read < everything / 4, (total_read, selected, everything)
    assert_same_multiset(_arm_rows("narrow", "iceberg"), wide_rows().select("id", "name"))


def test_postgres_downstream_selects_only_the_two_selected_columns(env, instance, statements):
    defs = narrow_defs("pg")
    _materialize(defs, instance, "wide")
    statements.mark()

    _materialize(defs, instance, "narrow")

    reads = statements.reads_of("wide")
    assert reads, "no read of the upstream's rows was logged"
    for query in reads:
        assert statements.columns(query) == {"id", "name"}, query
    assert_same_multiset(_arm_rows("narrow", "pg"), wide_rows().select("id", "name"))


# --- a delta dataset over an upstream dataset written in several appends --------------------------

BATCHES = 6
PER_BATCH = 500


def event_batch(i: int) -> pl.DataFrame:
    """Batch i: seq in (i*PER_BATCH, (i+1)*PER_BATCH], one append (one data file) each."""
    seq = pl.int_range(i * PER_BATCH + 1, (i + 1) * PER_BATCH + 1)
    return pl.select(
        id=seq * 10, seq=seq, v=pl.format("v{}", seq), payload=pl.format("p{}-{}", seq, seq * 31)
    )


def windows() -> list[Window]:
    """One window per batch, aligned on its bounds; the first open at the bottom."""
    return [
        Window(low=None if i == 0 else i * PER_BATCH, high=(i + 1) * PER_BATCH)
        for i in range(BATCHES)
    ]


def delta_defs(arm: str) -> tuple[dg.Definitions, dict[str, Any]]:
    state: dict[str, Any] = {"batch": event_batch(0)}

    @dataset("events", strategy="append_always", mode=arm)  # type: ignore[arg-type]
    def events() -> pl.DataFrame:
        return state["batch"]  # type: ignore[no-any-return]

    @dataset(
        "ev_copy",
        strategy="append_always",
        mode=arm,  # type: ignore[arg-type]
        delta=Delta(source="events", watermark="seq"),
    )
    def ev_copy(events: pl.LazyFrame) -> pl.DataFrame:
        return events.select("id", "seq", "v").collect()

    return build_definitions(datasets=[events, ev_copy], with_parity_checks=False), state


def _write_upstream(defs: dg.Definitions, state: dict[str, Any], instance: Any) -> pl.DataFrame:
    for i in range(BATCHES):
        state["batch"] = event_batch(i)
        _materialize(defs, instance, "events")
    return pl.concat([event_batch(i) for i in range(BATCHES)])


def _plan(instance: dg.DagsterInstance) -> list[str]:
    get_runtime().windows.plan("ev_copy", windows())
    keys = [w.to_key() for w in windows()]
    instance.add_dynamic_partitions("ev_copy__windows", keys)
    return keys


def test_iceberg_delta_over_a_dataset_reads_only_each_windows_files(env, instance):
    defs, state = delta_defs("iceberg")
    upstream = _write_upstream(defs, state, instance)
    files = _data_files("events")
    assert len(files) == BATCHES  # one data file per append
    keys = _plan(instance)

    for i, key in enumerate(keys):
        # window i lies in append i's file: every other data file is moved away while it runs,
        # so a read that opened one would fail (they are pruned by their seq statistics)
        window_file = sorted(files, key=lambda p: _first_seq(p))[i]
        hidden = [Path(p.removeprefix("file://")) for p in files if p != window_file]
        for path in hidden:
            path.rename(path.with_name(path.name + ".away"))
        try:
            _materialize(defs, instance, "ev_copy", key)
        finally:
            for path in hidden:
                path.with_name(path.name + ".away").rename(path)

    assert_same_multiset(_arm_rows("ev_copy", "iceberg"), upstream.select("id", "seq", "v"))


def _first_seq(path: str) -> int:
    return int(pl.read_parquet(path.removeprefix("file://"), columns=["seq"])["seq"].min())  # type: ignore[arg-type]


def test_postgres_delta_over_a_dataset_reads_only_each_windows_rows(env, instance, statements):
    defs, state = delta_defs("pg")
    upstream = _write_upstream(defs, state, instance)
    keys = _plan(instance)

    for window, key in zip(windows(), keys, strict=True):
        statements.mark()
        _materialize(defs, instance, "ev_copy", key)
        reads = statements.reads_of("events")
        assert reads, key
        for query in reads:
            assert statements.columns(query) == {"id", "seq", "v"}, query
            assert f"::bigint) <= {window.high}" in query, query
            if window.low is not None:
                assert f"::bigint) > {window.low}" in query, query
        assert sum(statements.rows(q) for q in reads) == PER_BATCH, key

    assert_same_multiset(_arm_rows("ev_copy", "pg"), upstream.select("id", "seq", "v"))


# --- the core: Publisher.scan and the predicate translation, against polars ------------------------

TRICKY = pl.DataFrame(
    {
        "id": pl.Series(range(1, 9), dtype=pl.Int64),
        "s": ["a", "Z", "ü", None, "ab", "b", "a", "é"],
        "f": [1.0, float("nan"), None, -2.5, 0.0, 3.0, float("nan"), 2.0],
        "ts": pl.Series(
            [datetime(2024, 3, 1, h, tzinfo=UTC) if h % 3 else None for h in range(8)],
            dtype=pl.Datetime("us", "UTC"),
        ),
        "wall": [datetime(2024, 3, 1, h) for h in range(8)],
        "d": [date(2024, 1, 1 + i) for i in range(8)],
        "b": [True, False, None, True, False, True, None, False],
        "seq": pl.Series([10, 20, 30, 40, 50, 60, 70, 80], dtype=pl.Int64),
    }
)

PREDICATES: list[Callable[[], pl.Expr]] = [
    lambda: pl.col("s") > "a",
    lambda: pl.col("s") <= "b",
    lambda: pl.col("s") == "ü",
    lambda: pl.col("s") != "a",
    lambda: pl.col("s").is_in(["a", "é", "zz"]),
    lambda: pl.col("s").is_in(["b", None], nulls_equal=True),
    lambda: pl.col("s").is_in(["b", None]),
    lambda: pl.col("s").is_null(),
    lambda: pl.col("s").is_not_null() & (pl.col("id") >= 3),
    lambda: (pl.col("id") < 3) | (pl.col("id") > 6),
    lambda: pl.col("id").is_between(2, 5, closed="right"),
    lambda: pl.col("f") > 0.5,  # not pushed: polars orders NaN above every number
    lambda: pl.col("f").is_nan(),
    lambda: pl.col("ts") > datetime(2024, 3, 1, 2, tzinfo=UTC),
    lambda: pl.col("ts") <= datetime(2024, 3, 1, 5, 30, tzinfo=timezone_plus(2)),
    lambda: pl.col("wall") >= datetime(2024, 3, 1, 4),
    lambda: pl.col("d") < date(2024, 1, 4),
    lambda: pl.col("b"),
    lambda: ~pl.col("b"),
    lambda: pl.col("b").is_null() | (pl.col("s") == "b"),
    lambda: pl.col("s").str.starts_with("a") & (pl.col("seq") > 10),
    lambda: pl.col("id") + 1 > pl.col("seq") / 10,
]


def timezone_plus(hours: int) -> Any:
    from datetime import timezone

    return timezone(timedelta(hours=hours))


@pytest.fixture
def stores(env: str) -> Any:
    from pipeline_output.contract.spec import DatasetSpec

    runtime = get_runtime()
    spec = DatasetSpec(name="tricky", strategy="replace")
    runtime.iceberg.write(spec, TRICKY)
    runtime.postgres.write(spec, TRICKY)
    return runtime, spec


@pytest.mark.parametrize("arm", ["iceberg", "pg"])
@pytest.mark.parametrize("make", PREDICATES, ids=[str(p()) for p in PREDICATES])
def test_pushed_filters_return_what_polars_returns(stores, arm, make):
    from pipeline_output.services.publish import ResolvedMode

    runtime, spec = stores
    frame = runtime.publisher.scan(spec, mode=ResolvedMode(arm, "run config"))  # type: ignore[arg-type]
    got = frame.filter(make()).select("id", "s", "seq").collect()
    expected = TRICKY.filter(make()).select("id", "s", "seq")
    assert_same_multiset(got, expected)


def test_translation_pushes_the_documented_forms_only():
    from pipeline_output.contract.predicates import AnyOf, Compare, InList, Nullness, pushable_terms

    schema = TRICKY.schema

    def pushed(expr: pl.Expr) -> list[Any]:
        seen: list[Any] = []

        def source(cols: Any, predicate: Any, n_rows: Any, batch: Any) -> Iterator[pl.DataFrame]:
            seen.append(pushable_terms(predicate, schema))
            yield TRICKY.filter(predicate) if predicate is not None else TRICKY

        from polars.io.plugins import register_io_source

        register_io_source(source, schema=schema).filter(expr).collect()
        return seen[0]

    assert pushed((pl.col("seq") > 10) & (pl.col("seq") <= 30)) == [
        Compare("seq", ">", 10),
        Compare("seq", "<=", 30),
    ]
    assert pushed(pl.col("s").is_in(["a", None])) == [InList("s", ("a",))]
    assert pushed(pl.col("s").is_not_null()) == [Nullness("s", negated=True)]
    assert pushed((pl.col("id") < 2) | (pl.col("s") == "b")) == [
        AnyOf(((Compare("id", "<", 2),), (Compare("s", "==", "b"),)))
    ]
    aware = datetime(2024, 3, 1, 2, tzinfo=UTC)
    assert pushed(pl.col("ts") > aware) == [Compare("ts", ">", aware)]
    assert pushed(pl.col("f") > 0.5) == []  # floats: NaN orders differently
    assert pushed(pl.col("s").str.contains("a") & (pl.col("id") == 3)) == [Compare("id", "==", 3)]
    assert pushed(pl.col("s").str.contains("a") | (pl.col("id") == 3)) == []  # half an OR: none


@pytest.mark.parametrize("arm", ["iceberg", "pg"])
def test_scan_is_lazy_counts_limits_and_keeps_types(stores, arm):
    from pipeline_output.services.publish import ResolvedMode

    runtime, spec = stores
    frame = runtime.publisher.scan(spec, mode=ResolvedMode(arm, "run config"))  # type: ignore[arg-type]
    assert frame.collect_schema() == TRICKY.schema
    assert frame.select(pl.len()).collect().item() == TRICKY.height
    assert frame.filter(pl.col("seq") > 20).select(pl.len()).collect().item() == 6
    assert frame.head(3).collect().height == 3
    assert_same_multiset(frame.collect(), TRICKY)  # a LazyFrame can be collected again
    assert_same_multiset(frame.collect(engine="streaming"), TRICKY)
    windowed = runtime.publisher.scan(
        spec,
        mode=ResolvedMode(arm, "run config"),  # type: ignore[arg-type]
        window=Window(low=20, high=50),
        watermark="seq",
    )
    assert_same_multiset(windowed.collect(), TRICKY.filter(pl.col("seq").is_between(21, 50)))
    zoned = runtime.publisher.scan(
        spec,
        mode=ResolvedMode(arm, "run config"),  # type: ignore[arg-type]
        window=Window(low=datetime(2024, 3, 1, 1), high=datetime(2024, 3, 1, 4)),  # naive: UTC
        watermark="ts",
    )
    assert sorted(zoned.collect()["id"]) == [3, 5]  # 02:00 and 04:00 (03:00 is null)


def test_an_iceberg_scan_is_pinned_to_the_snapshot_current_when_it_was_built(stores):
    from pipeline_output.services.publish import ResolvedMode

    runtime, spec = stores
    frame = runtime.publisher.scan(spec, mode=ResolvedMode("iceberg", "run config"))
    runtime.iceberg.write(spec, TRICKY.head(2))  # a new snapshot replaces the rows
    assert_same_multiset(frame.collect(), TRICKY)
    assert_same_multiset(frame.filter(pl.col("id") > 4).collect(), TRICKY.filter(pl.col("id") > 4))
    fresh = runtime.publisher.scan(spec, mode=ResolvedMode("iceberg", "run config"))
    assert_same_multiset(fresh.collect(), TRICKY.head(2))


def test_a_column_added_since_the_last_commit_reads_as_null_in_the_current_state(stores):
    from pyiceberg.types import DoubleType

    runtime, spec = stores
    table = runtime.iceberg.load(spec)
    snapshot = table.current_snapshot().snapshot_id
    with table.update_schema() as update:  # a schema change alone: no new snapshot
        update.add_column("later", DoubleType())
    expected = TRICKY.with_columns(later=pl.lit(None, dtype=pl.Float64))
    assert_same_multiset(runtime.iceberg.read(spec), expected)  # as pyiceberg's scan reads it
    raw = pl.from_arrow(runtime.iceberg.load(spec).scan().to_arrow())
    assert isinstance(raw, pl.DataFrame) and sorted(raw.columns) == sorted(expected.columns)
    assert runtime.iceberg.read(spec, columns=["id", "later"]).get_column("later").null_count() == 8
    assert_same_multiset(runtime.iceberg.read(spec, as_of=snapshot), TRICKY)  # that version's


@pytest.mark.parametrize("reads_from", ["iceberg", "pg"])
def test_dual_mode_scans_the_arm_dual_reads_from_names(stores, reads_from):
    from pipeline_output.services.publish import Publisher, ResolvedMode

    runtime, spec = stores
    runtime.iceberg.write(spec, TRICKY.head(3))  # the arms now differ: 3 vs 8 rows
    publisher = Publisher(
        iceberg=runtime.iceberg,
        postgres=runtime.postgres,
        ledger=runtime.ledger,
        dual_reads_from=reads_from,  # type: ignore[arg-type]
    )
    got = publisher.scan(spec, mode=ResolvedMode("dual", "run config")).collect()
    assert_same_multiset(got, TRICKY.head(3) if reads_from == "iceberg" else TRICKY)
