"""Model-based (stateful) tests: random sequences of deploys applied to BOTH arms.

A hypothesis `RuleBasedStateMachine` drives one or two datasets, each with a random strategy, through
random deploys: batches with overlapping / new / missing keys, keys whose watermark moves to another
window (a windowed replace must then replace a key stored outside its window), nulls in non-key
columns, NaN, empty batches, columns added (and later omitted), datasets partitioned (by key buckets, key truncation,
a value column) or not, and delta windows over an integer, `timestamptz` or
`timestamp` watermark (bounds round-tripped through their partition key, as the sensor does) —
or, beside them, Dagster-partitioned datasets (daily, hourly across a DST change, static,
daily by region: `model_partitions.py`) written partition by partition, keys moving between
partitions, a row outside its partition refused by both arms —, with
the database's server TimeZone drawn per example (UTC or not). After every step the Iceberg arm and
the legacy Postgres arm each equal an independent polars model (`oracle.expect`, which imports
nothing from `pipeline_output`) and each other, as typed multisets; both arms pick the same write
mode and report the same counters; a refused write (empty replace/sync) is refused by both and
changes neither.

Profiles (env `PIPELINE_OUTPUT_HYPOTHESIS_PROFILE`): `ci` (default: few examples, CI budget) and
`deep` (many examples, longer sequences). Failing sequences hypothesis shrank are kept below as
plain regression tests (`test_regression_*`).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import re
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import polars as pl
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from pipeline_output import DatasetSpec, Delta, IcebergStore, Window
from pipeline_output.errors import EmptyComputeRefused, RowsOutsideWindow
from pipeline_output.infra.locks import AdvisoryLock
from pipeline_output.stores.postgres import PostgresStore
from pipeline_output_tests.oracle import assert_same_multiset, expect, in_window
from pipeline_output_tests.reliability import model_partitions
from pipeline_output_tests.reliability.model_time_travel import TimeTravelRules, travel_figures
from pipeline_output_tests.reliability.report import profile, record

NS = "datasets"
STRATEGIES = ["snapshot_replace", "append_always", "append_new", "replace", "sync"]
EXTRA_TYPES = {"int": pl.Int64, "str": pl.String, "float": pl.Float64}
KEY_SPACE = 30
MOVE = 7  # how far a moved row's watermark lies from its id's (into another window)
WATERMARK_KINDS = ["int", "timestamptz", "timestamp"]
# partition_by drawn per dataset: none, key buckets (merges prune by them), key truncation, and an
# identity partition over a value column with nulls and quotes
PARTITIONINGS: list[tuple[str, ...]] = [(), (), ("bucket(4, id)",), ("truncate(8, id)",), ("s",)]
SERVER_ZONES = ["UTC", "Asia/Tokyo", "America/Los_Angeles"]
# the Iceberg arm's merge mode per dataset: forced merge-on-read (the model's tables are small,
# so `auto` alone would always rewrite), forced copy-on-write, and the cost-based default
HINTS = ["merge-on-read", "merge-on-read", "copy-on-write", "auto"]
EPOCH = datetime(2026, 3, 28, 22, 0, tzinfo=UTC)  # hours later cross a DST change (Europe/US)

PROFILES = {
    "ci": {"max_examples": 10, "stateful_step_count": 8},
    "deep": {"max_examples": 200, "stateful_step_count": 20},
}


def _settings() -> settings:
    chosen = dict(PROFILES[profile()])
    if os.environ.get("PIPELINE_OUTPUT_HYPOTHESIS_EXAMPLES"):  # override the profile's count
        chosen["max_examples"] = int(os.environ["PIPELINE_OUTPUT_HYPOTHESIS_EXAMPLES"])
    return settings(
        **chosen,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        print_blob=True,
    )


_names = itertools.count()

# -- batches ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    id: int
    version: int  # 0..2: value version (so repeated ids are changed or identical)
    v_null: bool  # v is null
    f_kind: int  # 0 number, 1 NaN, 2 null
    moved: bool = False  # the watermark is MOVE later than the id's: the key changes window


rows_st = st.lists(
    st.builds(
        Row,
        id=st.integers(0, KEY_SPACE - 1),
        version=st.integers(0, 2),
        v_null=st.booleans(),
        f_kind=st.sampled_from([0, 0, 1, 2]),
        moved=st.sampled_from([False, False, False, True]),
    ),
    max_size=12,
    unique_by=lambda r: r.id,
)

_window_bounds_st = st.tuples(
    st.one_of(st.none(), st.integers(0, KEY_SPACE - 2)), st.integers(1, KEY_SPACE)
).map(lambda t: t if t[0] is None or t[0] < t[1] else (None, t[1]))
# low >= 0: a negative integer bound cannot be encoded as a window key (see the report).
windows_st = st.one_of(st.none(), _window_bounds_st)


def watermark_value(value: int, kind: str) -> Any:
    """The watermark of id `value`: the id itself, or `value` hours after EPOCH (aware UTC for
    timestamptz, the naive UTC wall clock for timestamp)."""
    if kind == "int":
        return value
    at = EPOCH + timedelta(hours=value)
    return at if kind == "timestamptz" else at.replace(tzinfo=None)


WATERMARK_DTYPES: dict[str, Any] = {
    "int": pl.Int64,
    "timestamptz": pl.Datetime("us", "UTC"),
    "timestamp": pl.Datetime("us"),
}


def make_batch(rows: list[Row], extras: dict[str, str], wm_kind: str = "int") -> pl.DataFrame:
    """The compute's output: id (key), seq (watermark from id), v int?, f float (NaN/null), s
    str?, plus the dataset's currently produced extra columns."""
    ids = [r.id for r in rows]
    f_values: list[float | None] = []
    for r in rows:
        f_values.append(
            float(r.version) + 0.5 if r.f_kind == 0 else (float("nan") if r.f_kind == 1 else None)
        )
    cols: dict[str, pl.Series] = {
        "id": pl.Series(ids, dtype=pl.Int64),
        "seq": pl.Series(
            [watermark_value(r.id + (MOVE if r.moved else 0), wm_kind) for r in rows],
            dtype=WATERMARK_DTYPES[wm_kind],
        ),
        "v": pl.Series([None if r.v_null else r.id * 10 + r.version for r in rows], dtype=pl.Int64),
        "f": pl.Series(f_values, dtype=pl.Float64),
        "s": pl.Series(
            [None if r.version == 2 else f"s{r.id}-{r.version}'\";" for r in rows], dtype=pl.String
        ),
    }
    for name, kind in extras.items():
        dtype = EXTRA_TYPES[kind]
        if kind == "int":
            values: list[Any] = [r.id * 100 + r.version for r in rows]
        elif kind == "str":
            values = [f"{name}-{r.id}-{r.version}" for r in rows]
        else:
            values = [r.id / 7 + r.version for r in rows]
        cols[name] = pl.Series(values, dtype=dtype)
    return pl.DataFrame(cols)


# -- one dataset, both arms, the model --------------------------------------------------------


@dataclass
class Arms:
    """The two arms on one Postgres and one catalog (a second catalog handle reads back)."""

    iceberg: IcebergStore
    reader: IcebergStore
    postgres: PostgresStore
    steps: int = 0
    refused: int = 0
    rows_written: int = 0


@dataclass
class DatasetModel:
    spec: DatasetSpec
    table: pl.DataFrame | None = None  # None: never deployed (first deploy next)
    extras: dict[str, str] = field(default_factory=dict)  # columns the compute produces now
    ever_extras: dict[str, str] = field(default_factory=dict)  # every column ever added
    wm_kind: str = "int"  # the watermark's type: int, timestamptz or timestamp
    dagster: str | None = None  # Dagster-partitioned (`model_partitions.KINDS`) instead of delta


def new_dataset(
    strategy: str,
    wm_kind: str = "int",
    partition_by: tuple[str, ...] = (),
    hint: str = "auto",
    dagster: str | None = None,
) -> DatasetModel:
    spec = DatasetSpec(
        name=f"m{next(_names)}_{int(time.time() * 1000) % 100000}",
        primary_key=("id",),
        strategy=strategy,  # type: ignore[arg-type]
        delta=Delta(source="raw", watermark="seq") if dagster is None else None,
        partition_by=partition_by,
        write_strategy_hint=hint,  # type: ignore[arg-type]
    )
    return DatasetModel(spec=spec, wm_kind=wm_kind, dagster=dagster)


COUNTERS = ("rows_inserted", "rows_updated", "rows_deleted", "rows_skipped", "rows_total_after")


def deploy(
    arms: Arms,
    ds: DatasetModel,
    rows: list[Row],
    window: tuple[int | None, int] | None,
    *,
    stray: bool = False,
) -> None:
    """Write one batch to both arms and advance the model; check modes, counters, refusals.

    A Dagster-partitioned dataset takes the drawn window as a partition (its `high` picks the
    key); with `stray` one row outside that partition joins the batch, which both arms refuse."""
    batch = make_batch(rows, ds.extras, ds.wm_kind)
    w = None
    bounds = None
    part, within = None, None
    if ds.dagster is not None:
        batch = batch.with_columns(**model_partitions.partition_values(rows))
    if ds.dagster is not None and window is not None:
        part, within = model_partitions.drawn(ds.dagster, window[1])
        inside, outside = batch.filter(within), batch.filter(~within)
        if stray:
            if outside.height == 0:
                return
            for store in (arms.iceberg, arms.postgres):
                with pytest.raises(RowsOutsideWindow):
                    store.write(ds.spec, pl.concat([inside, outside.head(1)]), partition=part)
            _CTX["strays_refused"] = _CTX.get("strays_refused", 0) + 1
            return
        counts = _CTX.setdefault("partition_deploys", {})
        counts[ds.dagster] = counts.get(ds.dagster, 0) + 1
        batch = inside
    elif window is not None and ds.table is not None:  # on a first deploy still a replace
        low = None if window[0] is None else watermark_value(window[0], ds.wm_kind)
        high = watermark_value(window[1], ds.wm_kind)
        bounds = (low, high)
        # the store gets the bounds the sensor would: decoded from the window's partition key
        w = Window.from_key(Window(low=low, high=high).to_key())
        batch = batch.filter(in_window("seq", low, high))
        _CTX.setdefault("windowed", {}).setdefault(ds.wm_kind, 0)
        _CTX["windowed"][ds.wm_kind] += 1
        if ds.spec.strategy == "replace" and ds.table is not None:
            stored = ds.table.join(batch.select("id", "seq"), on="id", suffix="_new")
            if stored.filter(pl.col("seq") != pl.col("seq_new")).height:
                _CTX["moved_replaces"] = _CTX.get("moved_replaces", 0) + 1
    exp = expect(
        ds.spec.strategy, ds.table, batch, ["id"], window=bounds, watermark="seq", within=within
    )
    refused = not exp.first_deploy and batch.height == 0 and exp.counters.get("rows_deleted", 0) > 0
    arms.steps += 1
    run_id = f"step{arms.steps}"
    if refused:
        arms.refused += 1
        with pytest.raises(EmptyComputeRefused):
            arms.iceberg.write(ds.spec, batch, window=w, partition=part, run_id=run_id)
        with pytest.raises(EmptyComputeRefused):
            arms.postgres.write(ds.spec, batch, window=w, partition=part, run_id=run_id)
        return
    ice = arms.iceberg.write(ds.spec, batch, window=w, partition=part, run_id=run_id)
    pg = arms.postgres.write(ds.spec, batch, window=w, partition=part, run_id=run_id)
    arms.rows_written += batch.height
    _CTX["merged_on_read"] = _CTX.get("merged_on_read", 0) + ice.files_merged_on_read
    assert ice.write_mode == exp.write_mode, (ice.write_mode, exp.write_mode)
    assert pg.write_mode == exp.write_mode, (pg.write_mode, exp.write_mode)
    assert ice.first_deploy is exp.first_deploy and pg.first_deploy is exp.first_deploy
    if exp.write_mode != "replace":
        want = {k: exp.counters.get(k, 0) for k in COUNTERS}
        for arm, res in (("iceberg", ice), ("pg", pg)):
            got = {k: getattr(res, k) for k in COUNTERS}
            assert got == want, f"{arm} counters {got} != model {want}"
    assert ice.rows_total_after == pg.rows_total_after == exp.table.height
    ds.table = exp.table


def check(arms: Arms, ds: DatasetModel) -> None:
    """Each arm equals the model; the arms equal each other (typed multisets)."""
    if ds.table is None:
        return
    ice = arms.reader.read(ds.spec)
    raw = pl.from_arrow(arms.reader.load(ds.spec).scan().to_arrow())
    assert isinstance(raw, pl.DataFrame)
    pg = arms.postgres.read(ds.spec)
    assert_same_multiset(ice, raw)
    assert_same_multiset(ice, ds.table)
    assert_same_multiset(pg, ds.table)
    assert_same_multiset(ice, pg)


# -- partition-spec changes between writes (issue 30, item 4) -------------------------------

# partition_by drawn again between deploys: a transform's parameter changed (bucket(4, id) ->
# bucket(8, id), truncate widths), fields added (or removed), back to unpartitioned (`()`), and
# not said (None: the table keeps its spec)
SPEC_CHANGES: list[tuple[str, ...] | None] = [
    ("bucket(4, id)",),
    ("bucket(8, id)",),
    ("bucket(16, id)",),
    ("truncate(3, id)",),
    ("truncate(5, id)",),
    ("truncate(8, id)",),
    ("s", "bucket(4, id)"),
    ("s", "bucket(8, id)"),
    ("bucket(4, id)", "s"),
    ("s", "truncate(5, id)"),
    ("s",),
    (),
    None,
]


def spec_change_kind(before: tuple[str, ...], after: tuple[str, ...] | None) -> str:
    """What a drawn change does to the terms last said: `parameter` (the same transforms of the
    same columns, a size changed), `added` / `removed` fields, `unpartitioned`, `not said`,
    `same` or `other`."""
    if after is None:
        return "not said"
    if after == before:
        return "same"
    if after == ():
        return "unpartitioned"

    def shape(terms: tuple[str, ...]) -> list[str]:
        return [t.split("(")[0] + ("" if "(" not in t else t.split(",")[-1]) for t in terms]

    if shape(after) == shape(before):
        return "parameter"
    if set(shape(before)) < set(shape(after)):
        return "added"
    if set(shape(after)) < set(shape(before)):
        return "removed"
    return "other"


class PartitionSpecChanges:
    """Mixed into every deploy machine: `partition_by` changes between deploys (so later merges,
    merge-on-read ones included, delete rows of files written under an earlier spec); after a
    change, the table's specs and its delete files on earlier specs are counted."""

    datasets: list[DatasetModel]
    arms: Arms

    @rule(which=st.integers(0, 1), terms=st.sampled_from(SPEC_CHANGES))
    def change_partition_by(self, which: int, terms: tuple[str, ...] | None) -> None:
        ds = self.datasets[which % len(self.datasets)]
        said = _CTX.setdefault("said", {})
        before = said.get(ds.spec.name, ds.spec.partition_by or ())
        kind = spec_change_kind(before, terms)
        changes = _CTX.setdefault("spec_changes", {})
        changes[kind] = changes.get(kind, 0) + 1
        if terms is not None:
            said[ds.spec.name] = terms
        _CTX.setdefault("changed", set()).add(ds.spec.name)
        ds.spec = dataclasses.replace(ds.spec, partition_by=terms)

    @rule(which=st.integers(0, 1), size=st.sampled_from([1, 2, 3, 4, 8, 16]))
    def change_a_partition_parameter(self, which: int, size: int) -> None:
        """Every bucket count and truncate width of the terms last said becomes `size` (none
        said: `bucket(size, id)` is added)."""
        ds = self.datasets[which % len(self.datasets)]
        said = _CTX.setdefault("said", {}).get(ds.spec.name, ds.spec.partition_by or ())
        if any("(" in t for t in said):
            self.change_partition_by(which, tuple(re.sub(r"\(\d+,", f"({size},", t) for t in said))
        else:
            self.change_partition_by(which, (*said, f"bucket({size}, id)"))

    @invariant()
    def count_specs_and_old_spec_delete_files(self) -> None:
        for ds in self.datasets:
            if ds.table is None or ds.spec.name not in _CTX.get("changed", ()):
                continue
            table = self.arms.reader.load(ds.spec)
            if table is None:
                continue
            current = table.metadata.default_spec_id
            old = sum(
                1
                for task in table.scan().plan_files()
                for d in task.delete_files
                if d.spec_id != current
            )
            _CTX["max_specs"] = max(_CTX.get("max_specs", 0), len(table.metadata.specs()))
            _CTX["old_spec_delete_files"] = max(_CTX.get("old_spec_delete_files", 0), old)


# -- the state machine ------------------------------------------------------------------------

_CTX: dict[str, Any] = {}


def _datasets_st(strategies: list[str], hints: st.SearchStrategy[list[str]]) -> dict[str, Any]:
    """The draws of a machine's datasets (up to two): strategy, watermark kind, server zone,
    partitioning and merge mode."""
    return {
        "strategies": st.lists(st.sampled_from(strategies), min_size=1, max_size=2),
        "kinds": st.lists(st.sampled_from(WATERMARK_KINDS), min_size=2, max_size=2),
        "zone": st.sampled_from(SERVER_ZONES),
        "partitions": st.lists(st.sampled_from(PARTITIONINGS), min_size=2, max_size=2),
        "hints": hints,
        # delta datasets, and Dagster-partitioned ones beside them (half of these on an Iceberg
        # partition spec matching their partitions)
        "dagster": st.lists(
            st.sampled_from([None, None, *model_partitions.KINDS]), min_size=2, max_size=2
        ),
        "matching": st.lists(st.booleans(), min_size=2, max_size=2),
    }


class DeployMachine(TimeTravelRules, PartitionSpecChanges, RuleBasedStateMachine):
    """Random deploy sequences over up to two datasets with random strategies, with snapshot
    expiry between time-travel reads of the Iceberg arm (`TimeTravelRules`) and partition-spec
    changes between writes (`PartitionSpecChanges`)."""

    def __init__(self) -> None:
        super().__init__()
        self.arms: Arms = _CTX["make_arms"]()
        self.datasets: list[DatasetModel] = []

    @initialize(
        **_datasets_st(STRATEGIES, st.lists(st.sampled_from(HINTS), min_size=2, max_size=2))
    )
    def create(
        self,
        strategies: list[str],
        kinds: list[str],
        zone: str,
        partitions: list[tuple[str, ...]],
        hints: list[str],
        dagster: list[str | None],
        matching: list[bool],
    ) -> None:
        _CTX["set_zone"](zone)
        _CTX["zones"].add(zone)
        _CTX["kinds"].update(kinds[: len(strategies)])
        partitions = [
            model_partitions.MATCHING_SPEC[d] if d is not None and m else p
            for p, d, m in zip(partitions, dagster, matching, strict=True)
        ]
        _CTX["partitionings"].update(" ".join(p) or "none" for p in partitions[: len(strategies)])
        _CTX["hints"].update(hints[: len(strategies)])
        _CTX.setdefault("dagster_kinds", set()).update(
            d or "delta" for d in dagster[: len(strategies)]
        )
        self.datasets = [
            new_dataset(s, k, p, h, d)
            for s, k, p, h, d in zip(strategies, kinds, partitions, hints, dagster, strict=False)
        ]

    @rule(which=st.integers(0, 1), rows=rows_st, window=windows_st)
    def deploy(self, which: int, rows: list[Row], window: tuple[int | None, int] | None) -> None:
        deploy(self.arms, self.datasets[which % len(self.datasets)], rows, window)

    @rule(which=st.integers(0, 1), rows=rows_st, window=_window_bounds_st)
    def deploy_window(self, which: int, rows: list[Row], window: tuple[int | None, int]) -> None:
        deploy(self.arms, self.datasets[which % len(self.datasets)], rows, window)

    @precondition(lambda self: any(d.dagster is not None for d in self.datasets))
    @rule(which=st.integers(0, 1), rows=rows_st, window=_window_bounds_st)
    def deploy_a_row_outside_its_partition(
        self, which: int, rows: list[Row], window: tuple[int | None, int]
    ) -> None:
        ds = self.datasets[which % len(self.datasets)]
        if ds.dagster is not None:
            deploy(self.arms, ds, rows, window, stray=True)

    @precondition(lambda self: any(d.table is not None and d.table.height for d in self.datasets))
    @rule(which=st.integers(0, 1), window=_window_bounds_st, version=st.integers(0, 2))
    def move_stored_keys_to_other_windows(
        self, which: int, window: tuple[int | None, int], version: int
    ) -> None:
        """Re-deploy every stored key with its watermark moved (or moved back), over a window:
        keys whose row lay outside the window now land inside it."""
        ds = self.datasets[which % len(self.datasets)]
        if ds.table is None or ds.table.height == 0:
            return
        stored = ds.table.unique(subset=["id"], keep="first").select("id", "seq").rows()
        rows = [
            Row(
                id=key,
                version=version,
                v_null=False,
                f_kind=0,
                moved=seq == watermark_value(key, ds.wm_kind),
            )
            for key, seq in stored
        ]
        deploy(self.arms, ds, rows, window)

    @rule(which=st.integers(0, 1), rows=rows_st)
    def redeploy_same_batch_twice(self, which: int, rows: list[Row]) -> None:
        ds = self.datasets[which % len(self.datasets)]
        deploy(self.arms, ds, rows, None)
        check(self.arms, ds)
        deploy(self.arms, ds, rows, None)

    @precondition(lambda self: any(len(d.ever_extras) < 3 for d in self.datasets))
    @rule(which=st.integers(0, 1), kind=st.sampled_from(sorted(EXTRA_TYPES)))
    def add_column(self, which: int, kind: str) -> None:
        ds = self.datasets[which % len(self.datasets)]
        if len(ds.ever_extras) >= 3:
            return
        name = f"x{len(ds.ever_extras)}_{kind}"
        ds.extras[name] = kind
        ds.ever_extras[name] = kind

    @rule(which=st.integers(0, 1))
    def stop_producing_a_column(self, which: int) -> None:
        ds = self.datasets[which % len(self.datasets)]
        if ds.extras:
            ds.extras.pop(next(iter(ds.extras)))

    @invariant()
    def arms_equal_model(self) -> None:
        for ds in self.datasets:
            check(self.arms, ds)

    def teardown(self) -> None:
        _CTX["steps"] += self.arms.steps
        _CTX["refused"] += self.arms.refused
        _CTX["rows"] += self.arms.rows_written
        _CTX["examples"] += 1
        self.arms.reader.catalog.engine.dispose()


class MergeOnReadMachine(DeployMachine):
    """The same sequences over datasets whose merges keep files and write delete files: the
    strategies that merge (upsert, sync, windowed replace) forced to merge-on-read, so every
    later deploy, read and check runs on tables that carry positional delete files."""

    @initialize(
        **_datasets_st(
            ["snapshot_replace", "sync", "replace"], st.just(["merge-on-read", "merge-on-read"])
        )
    )
    def create(self, **drawn: Any) -> None:
        super().create(**drawn)


def _arms_factory(catalog: Any, fresh_catalog: Any, pg_db_url: str) -> Any:
    postgres = PostgresStore(pg_db_url)

    def make() -> Arms:
        return Arms(
            iceberg=IcebergStore(catalog, NS, lock=AdvisoryLock(pg_db_url)),
            reader=IcebergStore(fresh_catalog(), NS, lock=AdvisoryLock(pg_db_url)),
            postgres=postgres,
        )

    return make


@pytest.fixture
def make_arms(catalog: Any, fresh_catalog: Any, pg_db_url: str) -> Any:
    return _arms_factory(catalog, fresh_catalog, pg_db_url)


@pytest.mark.parametrize(
    ("machine", "scenario"),
    [
        (DeployMachine, "model-based: random deploy sequences, both arms vs polars model"),
        (MergeOnReadMachine, "model-based: merge-on-read deploy sequences, both arms vs model"),
    ],
    ids=["every-strategy", "merge-on-read"],
)
def test_random_deploy_sequences_both_arms_match_the_model(
    make_arms: Any, set_server_zone: Any, machine: type[DeployMachine], scenario: str
) -> None:
    _CTX.clear()
    _CTX.update(
        make_arms=make_arms,
        set_zone=set_server_zone,
        steps=0,
        refused=0,
        rows=0,
        examples=0,
        zones=set(),
        kinds=set(),
        partitionings=set(),
        hints=set(),
    )
    started = time.perf_counter()
    run_state_machine_as_test(machine, settings=_settings())
    record(
        scenario,
        examples=_CTX["examples"],
        deploys=_CTX["steps"],
        refused_empty=_CTX["refused"],
        rows_written=_CTX["rows"],
        server_zones=",".join(sorted(_CTX["zones"])),
        watermarks=",".join(sorted(_CTX["kinds"])),
        partitionings=",".join(sorted(_CTX["partitionings"])),
        merge_modes=",".join(sorted(_CTX["hints"])),
        files_merged_on_read=_CTX.get("merged_on_read", 0),
        windowed_deploys=_CTX.get("windowed", {}),
        windowed_replaces_of_moved_keys=_CTX.get("moved_replaces", 0),
        dataset_kinds=",".join(sorted(_CTX.get("dagster_kinds", ()))),
        dagster_partition_deploys=_CTX.get("partition_deploys", {}),
        rows_outside_partition_refused=_CTX.get("strays_refused", 0),
        seconds=round(time.perf_counter() - started, 1),
        rows_lost=0,
        **travel_figures(),
        **partition_spec_figures(),
    )


# -- snapshot expiry between time-travel reads (issue 30): a machine that draws them often -------


class TimeTravelMachine(TimeTravelRules, RuleBasedStateMachine):
    """One dataset (any strategy, partitioning, merge mode), deploys, and the expiry / time-travel
    rules of `TimeTravelRules` — the deploy machines draw them too, among many more rules."""

    def __init__(self) -> None:
        super().__init__()
        self.arms: Arms = _CTX["make_arms"]()
        self.datasets: list[DatasetModel] = []

    @initialize(
        strategy=st.sampled_from(STRATEGIES),
        partition=st.sampled_from(PARTITIONINGS),
        hint=st.sampled_from(HINTS),
        first=st.lists(rows_st, min_size=2, max_size=4),
    )
    def create(
        self, strategy: str, partition: tuple[str, ...], hint: str, first: list[list[Row]]
    ) -> None:
        """The dataset, and a few versions of it to travel between."""
        self.datasets = [new_dataset(strategy, "int", partition, hint)]
        for rows in first:
            deploy(self.arms, self.datasets[0], rows, None)
            self.record_versions_and_log()

    @rule(rows=rows_st, window=windows_st)
    def deploy(self, rows: list[Row], window: tuple[int | None, int] | None) -> None:
        deploy(self.arms, self.datasets[0], rows, window)

    @invariant()
    def arms_equal_model(self) -> None:
        check(self.arms, self.datasets[0])

    def teardown(self) -> None:
        DeployMachine.teardown(self)  # type: ignore[arg-type]


def test_snapshot_expiry_between_time_travel_reads_never_answers_another_version(
    make_arms: Any,
) -> None:
    _CTX.clear()
    _CTX.update(make_arms=make_arms, steps=0, refused=0, rows=0, examples=0)
    started = time.perf_counter()
    run_state_machine_as_test(TimeTravelMachine, settings=_settings())
    record(
        "model-based: snapshot expiry between time-travel reads (Iceberg arm) vs the model",
        examples=_CTX["examples"],
        deploys=_CTX["steps"],
        rows_written=_CTX["rows"],
        seconds=round(time.perf_counter() - started, 1),
        rows_lost=0,
        **travel_figures(),
    )


def partition_spec_figures() -> dict[str, Any]:
    """The partition-spec changes drawn (by kind), the most specs one table had, and the most
    live delete files one table had on an earlier spec than its current one."""
    return {
        "spec_changes": _CTX.get("spec_changes", {}),
        "max_specs_per_table": _CTX.get("max_specs", 1),
        "max_delete_files_on_earlier_specs": _CTX.get("old_spec_delete_files", 0),
    }


# -- regressions: shrunk sequences, replayed as plain tests ------------------------------------


def _rows(ids: list[int], version: int = 0, **kw: Any) -> list[Row]:
    return [
        Row(
            id=i,
            version=version,
            v_null=kw.get("v_null", False),
            f_kind=kw.get("f_kind", 0),
            moved=kw.get("moved", False),
        )
        for i in ids
    ]


def _replay(
    make_arms: Any,
    strategy: str,
    steps: list[Any],
    *,
    wm_kind: str = "int",
    partition_by: tuple[str, ...] = (),
    hint: str = "auto",
) -> None:
    arms = make_arms()
    ds = new_dataset(strategy, wm_kind, partition_by, hint)
    for step in steps:
        if step[0] == "deploy":
            deploy(arms, ds, step[1], step[2])
        elif step[0] == "move":  # move_stored_keys_to_other_windows(window, version)
            assert ds.table is not None
            stored = ds.table.unique(subset=["id"], keep="first").select("id", "seq").rows()
            rows = [
                Row(
                    id=k,
                    version=step[2],
                    v_null=False,
                    f_kind=0,
                    moved=seq == watermark_value(k, wm_kind),
                )
                for k, seq in stored
            ]
            deploy(arms, ds, rows, step[1])
        elif step[0] == "add":
            ds.extras[step[1]] = step[2]
            ds.ever_extras[step[1]] = step[2]
        elif step[0] == "drop":
            ds.extras.pop(step[1])
        check(arms, ds)
    arms.reader.catalog.engine.dispose()


@pytest.mark.parametrize("strategy", ["replace", "sync"])
def test_regression_empty_batch_refused_by_both_arms_changes_nothing(
    make_arms: Any, strategy: str
) -> None:
    _replay(make_arms, strategy, [("deploy", _rows([1, 2, 3]), None), ("deploy", [], None)])


def test_regression_nan_and_null_values_rerun_is_a_noop_in_both_arms(make_arms: Any) -> None:
    rows = _rows([1, 2], f_kind=1) + _rows([3], v_null=True, f_kind=2)
    _replay(make_arms, "snapshot_replace", [("deploy", rows, None), ("deploy", rows, None)])


def test_regression_added_then_omitted_column_is_null_in_both_arms(make_arms: Any) -> None:
    _replay(
        make_arms,
        "append_new",
        [
            ("deploy", _rows([1, 2]), None),
            ("add", "x0_float", "float"),
            ("deploy", _rows([2, 3], version=1), None),
            ("drop", "x0_float"),
            ("deploy", _rows([4]), None),
        ],
    )


def test_regression_windowed_sync_and_replace_on_both_arms(make_arms: Any) -> None:
    for strategy in ("sync", "replace"):
        _replay(
            make_arms,
            strategy,
            [
                ("deploy", _rows(list(range(10))), None),
                ("deploy", _rows([4, 5, 9], version=1), (3, 6)),
                ("deploy", _rows([0], version=2), (None, 1)),
            ],
        )


@pytest.mark.parametrize("wm_kind", WATERMARK_KINDS)
def test_regression_windowed_replace_of_keys_moved_from_another_window_on_both_arms(
    make_arms: Any, wm_kind: str
) -> None:
    """Keys 1..5 stored at watermarks 1..5 are computed again at 8..12 by the window (7, 12]: their
    old rows lie outside it and must go, or the legacy arm stores each key twice (issue 16)."""
    for strategy in ("replace", "sync", "snapshot_replace"):
        _replay(
            make_arms,
            strategy,
            [
                ("deploy", _rows(list(range(1, 11))), None),
                ("deploy", _rows([1, 2, 3, 4, 5], version=1, moved=True), (7, 12)),
                ("deploy", _rows([1, 2, 3, 4, 5], version=1, moved=True), (7, 12)),  # re-run
                ("deploy", _rows([2, 3], version=2), (None, 4)),  # and moved back
            ],
            wm_kind=wm_kind,
        )


@pytest.mark.parametrize("wm_kind", ["timestamptz", "timestamp"])
def test_regression_zoned_watermark_windows_under_a_non_utc_server_on_both_arms(
    make_arms: Any, set_server_zone: Any, wm_kind: str
) -> None:
    set_server_zone("Asia/Tokyo")
    for strategy in ("sync", "replace", "append_new", "snapshot_replace"):
        _replay(
            make_arms,
            strategy,
            [
                ("deploy", _rows(list(range(10))), None),
                ("deploy", _rows([4, 5, 9], version=1), (3, 6)),
                ("deploy", _rows([0, 12], version=2), (None, 1)),
                ("deploy", _rows([12, 13], version=1), (9, 13)),
            ],
            wm_kind=wm_kind,
        )


def _row(i: int, version: int = 0, *, null: bool = False) -> Row:
    return Row(id=i, version=version, v_null=null, f_kind=0, moved=False)


def test_regression_merge_on_read_upsert_of_moved_keys_into_a_truncate_partitioned_table(
    make_arms: Any,
) -> None:
    """Found by the deep profile of the merge-on-read machine."""
    first = [_row(1, 2), _row(21, null=True), _row(29, 2, null=True), _row(18, null=True)]
    first += [_row(0, null=True), _row(3), _row(25, null=True)]
    second = [_row(19), _row(29, null=True), _row(27, null=True)]
    _replay(
        make_arms,
        "snapshot_replace",
        [
            ("deploy", [_row(0), _row(1), _row(26), _row(2)], (None, 6)),
            ("deploy", first, None),
            ("deploy", first, None),
            ("deploy", second, None),
            ("deploy", second, None),
            ("add", "x0_float", "float"),
            ("deploy", [], None),
            ("deploy", [], None),
            ("drop", "x0_float"),
            ("move", (None, 8), 0),
        ],
        partition_by=("truncate(8, id)",),
        hint="merge-on-read",
    )


def _deploys_across_partition_specs(make_arms: Any, hint: str, steps: list[Any]) -> None:
    """Replay `("partition_by", terms)` and `("deploy", rows, window)` steps on one dataset,
    checking both arms against the model after each."""
    arms = make_arms()
    ds = new_dataset("snapshot_replace", "int", (), hint)
    for step in steps:
        if step[0] == "partition_by":
            ds.spec = dataclasses.replace(ds.spec, partition_by=step[1])
        else:
            deploy(arms, ds, step[1], step[2])
        check(arms, ds)
    arms.reader.catalog.engine.dispose()


def test_regression_a_changed_bucket_count_between_deploys(make_arms: Any) -> None:
    """Found by the ci profile of the every-strategy machine (issue 30, item 4b): pyiceberg's
    duplicate partition field name `id_bucket`."""
    _deploys_across_partition_specs(
        make_arms,
        "merge-on-read",
        [
            ("partition_by", ("bucket(1, id)",)),
            ("deploy", [], None),
            ("partition_by", ("bucket(2, id)",)),
            ("deploy", [], None),
            ("deploy", [_row(3), _row(4)], None),
        ],
    )


def test_regression_merge_on_read_window_after_fields_were_added_to_the_partition_spec(
    make_arms: Any,
) -> None:
    """Found by the deep profile of the merge-on-read machine (issue 30, item 4a): a delete file
    for a data file of the earlier spec failed pyiceberg's snapshot summary (`IndexError`)."""
    rows = [_row(26), _row(0), _row(24, null=True), _row(1)]
    _deploys_across_partition_specs(
        make_arms,
        "merge-on-read",
        [
            ("partition_by", ("bucket(1, id)",)),
            ("deploy", rows, None),
            ("deploy", rows, None),
            ("partition_by", ("bucket(4, id)", "s")),
            ("deploy", [_row(0, 1)], (None, 1)),
        ],
    )
