"""The change feed (`stores/iceberg/table/changes.py`): `read_changes` between any two snapshots
of a table written through the project's own write path equals the oracle — the difference by
primary key of the table read as of the two snapshots by pyiceberg's own scan (as a multiset for
an unkeyed table) —, after every kind of write, schema evolution, compaction and rollback.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, date, datetime, timedelta
from typing import Any

import polars as pl
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io.pyarrow import ArrowScan
from pyiceberg.types import StringType

from pipeline_output import DatasetSpec, Delta, Window
from pipeline_output.contract.slices import PartitionSlice, TimeRange
from pipeline_output.errors import ChangesExpired, ChangesUnsupported
from pipeline_output.stores.iceberg.snapshot.commit import CHANGE_ADDED, CHANGE_FILE
from pipeline_output.stores.iceberg.table.changes import (
    CHANGE_COMMIT_TIME,
    CHANGE_SNAPSHOT,
    CHANGE_TYPE,
    CHANGE_TYPES,
    read_changes,
)
from pipeline_output.stores.iceberg.write.merge import CHANGE_FILES_PROPERTY
from pipeline_output_tests.iceberg_harness import Harness, customers

KEY = ["id"]


@pytest.fixture
def h(catalog: Any, fresh_catalog: Any, pg_db_url: str) -> Harness:
    """The harness with every table's changes consumed (what the ledger answers once a
    downstream ran): under the `auto` default upserts record change files, so the composed path
    is checked too."""
    return Harness(catalog, fresh_catalog, pg_db_url, change_consumers=lambda dataset: True)


# --- the oracle ---------------------------------------------------------------------------------


def state(table: Any, snapshot_id: int | None, to_id: int) -> pl.DataFrame:
    """The table as of `snapshot_id` read by pyiceberg's own reader under the `to` snapshot's
    schema (files matched by field id: renamed columns by id, columns a file lacks as null)."""
    to_schema = table.schemas()[table.snapshot_by_id(to_id).schema_id]
    if snapshot_id is None:
        arrow = to_schema.as_arrow().empty_table()
    else:
        tasks = list(table.scan(snapshot_id=snapshot_id).plan_files())
        arrow = ArrowScan(table.metadata, table.io, to_schema, AlwaysTrue()).to_table(tasks)
    frame = pl.from_arrow(arrow)
    assert isinstance(frame, pl.DataFrame)
    return frame


def oracle(table: Any, from_id: int | None, to_id: int, key: list[str]) -> pl.DataFrame:
    """Plain polars over the two states: per key (or as multisets), which rows changed how."""
    old, new = state(table, from_id, to_id), state(table, to_id, to_id)
    cols = new.columns
    if not key:
        n = "__n"
        o = old.with_columns(pl.int_range(pl.len()).over(cols).alias(n))
        w = new.with_columns(pl.int_range(pl.len()).over(cols).alias(n))
        gone = o.join(w, on=[*cols, n], how="anti", nulls_equal=True).drop(n)
        came = w.join(o, on=[*cols, n], how="anti", nulls_equal=True).drop(n)
        return pl.concat(
            [
                gone.with_columns(pl.lit("delete").alias(CHANGE_TYPE)),
                came.with_columns(pl.lit("insert").alias(CHANGE_TYPE)),
            ]
        )
    values = [c for c in cols if c not in key]
    j = old.join(new, on=key, how="full", coalesce=True, suffix="__new", nulls_equal=True)
    left = old.select(key).with_columns(pl.lit(True).alias("__old"))
    right = new.select(key).with_columns(pl.lit(True).alias("__new"))
    j = j.join(left, on=key, how="left").join(right, on=key, how="left")
    differ = pl.any_horizontal(
        [pl.col(c).ne_missing(pl.col(c + "__new")) for c in values] or [pl.lit(False)]
    )
    rows_old = j.select(key + values)
    rows_new = j.select(*key, *[pl.col(c + "__new").alias(c) for c in values])
    both = pl.col("__old").is_not_null() & pl.col("__new").is_not_null()
    return pl.concat(
        [
            rows_old.filter(j["__new"].is_null()).with_columns(pl.lit("delete").alias(CHANGE_TYPE)),
            rows_new.filter(j["__old"].is_null()).with_columns(pl.lit("insert").alias(CHANGE_TYPE)),
            rows_old.filter(j.select(both & differ).to_series()).with_columns(
                pl.lit("update_before").alias(CHANGE_TYPE)
            ),
            rows_new.filter(j.select(both & differ).to_series()).with_columns(
                pl.lit("update_after").alias(CHANGE_TYPE)
            ),
        ]
    ).select([*cols, CHANGE_TYPE])


def canonical(frame: pl.DataFrame) -> list[tuple[Any, ...]]:
    return sorted(frame.rows(), key=lambda r: tuple((v is None, str(type(v)), str(v)) for v in r))


COMPOSED = {"composed": 0, "diffed": 0}  # how often each path was checked (the property's)


def check(table: Any, from_id: int | None, to_id: int, key: list[str]) -> dict[str, int]:
    """`read_changes` equals the oracle by both paths: the manifest diff (`composed=False`) and,
    when the range's snapshots recorded their change (`composed=True` does not refuse), the
    composed change files; the default takes one of them."""
    expected = oracle(table, from_id, to_id, key)
    counts = matches(table, from_id, to_id, key, expected, composed=None)
    assert matches(table, from_id, to_id, key, expected, composed=False) == counts
    COMPOSED["diffed"] += 1
    if key:
        try:
            composed = matches(table, from_id, to_id, key, expected, composed=True)
        except ChangesUnsupported:
            pass
        else:
            assert composed == counts
            COMPOSED["composed"] += 1
    return counts


def matches(
    table: Any,
    from_id: int | None,
    to_id: int,
    key: list[str],
    expected: pl.DataFrame,
    *,
    composed: bool | None,
) -> dict[str, int]:
    got = read_changes(
        table, from_snapshot=from_id, to_snapshot=to_id, primary_key=key, composed=composed
    )
    frame = got.frame
    assert frame.columns == [
        *expected.columns[:-1],
        CHANGE_TYPE,
        CHANGE_SNAPSHOT,
        CHANGE_COMMIT_TIME,
    ]
    assert frame.get_column(CHANGE_SNAPSHOT).unique().to_list() in ([to_id], [])
    assert frame.schema[CHANGE_COMMIT_TIME] == pl.Datetime("us", "UTC")
    assert canonical(frame.drop(CHANGE_SNAPSHOT, CHANGE_COMMIT_TIME)) == canonical(
        expected.cast(frame.drop(CHANGE_SNAPSHOT, CHANGE_COMMIT_TIME).schema)  # type: ignore[arg-type]
    ), (from_id, to_id)
    assert set(got.counts) == set(CHANGE_TYPES)
    counted = frame.get_column(CHANGE_TYPE).value_counts()  # recorded counts (one write's) too
    assert got.counts == {**dict.fromkeys(CHANGE_TYPES, 0), **dict(counted.iter_rows())}
    assert got.from_snapshot == from_id and got.to_snapshot == to_id
    return dict(got.counts)


# --- writing through the project's own write path ---------------------------------------------


def keyed(strategy: str, hint: str = "auto", **kw: Any) -> DatasetSpec:
    return DatasetSpec(
        name="up",
        primary_key=("id",),
        strategy=strategy,  # type: ignore[arg-type]
        write_strategy_hint=hint,  # type: ignore[arg-type]
        **kw,
    )


def unkeyed(strategy: str) -> DatasetSpec:
    return DatasetSpec(name="flat", strategy=strategy)  # type: ignore[arg-type]


def head(h: Any, name: str) -> int:
    snap = h.table(name).current_snapshot()
    assert snap is not None
    return int(snap.snapshot_id)


def write(h: Any, spec: DatasetSpec, frame: pl.DataFrame, **kw: Any) -> int:
    h.store().write(spec, frame, run_id="r", **kw)
    return head(h, spec.name)


def test_the_first_read_gives_every_live_row_as_an_insert(
    h: Any,
) -> None:
    write(h, keyed("snapshot_replace"), customers(range(1, 21)))
    table = h.table("up")
    got = read_changes(table, from_snapshot=None, primary_key=KEY)
    assert got.counts == {"insert": 20, "delete": 0, "update_before": 0, "update_after": 0}
    assert got.frame.get_column("id").sort().to_list() == list(range(1, 21))
    assert got.to_snapshot == head(h, "up") and got.from_snapshot is None


def test_from_equal_to_to_is_an_empty_change_set(h: Any) -> None:
    s = write(h, keyed("snapshot_replace"), customers(range(1, 5)))
    got = read_changes(h.table("up"), from_snapshot=s, to_snapshot=s, primary_key=KEY)
    assert got.frame.height == 0 and sum(got.counts.values()) == 0
    assert got.frame.columns[-3:] == [CHANGE_TYPE, CHANGE_SNAPSHOT, CHANGE_COMMIT_TIME]


def test_an_expired_from_snapshot_raises_changes_expired_naming_table_and_snapshot(
    h: Any,
) -> None:
    s1 = write(h, keyed("snapshot_replace"), customers(range(1, 5)))
    write(h, keyed("snapshot_replace"), customers(range(1, 5), version=1))
    write(h, keyed("snapshot_replace"), customers(range(1, 5), version=2))
    h.store().expire_snapshots(
        keyed("snapshot_replace"), older_than=timedelta(0), retain_last=1, ledger=None
    )
    with pytest.raises(ChangesExpired, match=rf"datasets\.up.*{s1}"):
        read_changes(h.table("up"), from_snapshot=s1, primary_key=KEY)


def test_a_key_not_in_the_schema_is_refused(h: Any) -> None:
    write(h, keyed("snapshot_replace"), customers(range(1, 5)))
    with pytest.raises(ChangesUnsupported, match="nope"):
        read_changes(h.table("up"), from_snapshot=None, primary_key=["nope"])


@pytest.mark.parametrize("hint", ["copy-on-write", "merge-on-read"])
def test_an_upsert_reads_as_updates_and_inserts_and_identical_rows_as_nothing(
    h: Any, hint: str
) -> None:
    spec = keyed("snapshot_replace", hint)
    s1 = write(h, spec, customers(range(1, 201)))
    s2 = write(
        h,
        spec,
        pl.concat(
            [customers(range(1, 5), version=1), customers(range(5, 9)), customers(range(300, 303))]
        ),
    )
    counts = check(h.table("up"), s1, s2, KEY)
    assert counts == {"insert": 3, "delete": 0, "update_before": 4, "update_after": 4}


@pytest.mark.parametrize("hint", ["copy-on-write", "merge-on-read"])
def test_a_sync_reads_its_deletes_and_a_rollback_reads_as_the_reverse_change(
    h: Any, hint: str
) -> None:
    spec = keyed("sync", hint)
    s1 = write(h, spec, customers(range(1, 201)))
    s2 = write(h, spec, pl.concat([customers(range(1, 3), version=1), customers(range(3, 190))]))
    table = h.table("up")
    assert check(table, s1, s2, KEY) == {
        "insert": 0,
        "delete": 11,
        "update_before": 2,
        "update_after": 2,
    }
    assert check(table, s2, s1, KEY) == {
        "insert": 11,
        "delete": 0,
        "update_before": 2,
        "update_after": 2,
    }


def test_a_second_merge_on_read_upsert_of_the_same_file_reads_only_its_own_change(
    h: Any,
) -> None:
    spec = keyed("snapshot_replace", "merge-on-read")
    s1 = write(h, spec, customers(range(1, 201)))
    s2 = write(h, spec, customers(range(1, 4), version=1))
    s3 = write(h, spec, customers(range(10, 12), version=1))
    table = h.table("up")
    assert check(table, s2, s3, KEY)["update_after"] == 2
    assert check(table, s1, s3, KEY)["update_after"] == 5
    assert check(table, s3, s1, KEY)["update_after"] == 5


def test_append_replace_append_new_and_window_replace_read_as_the_oracle_says(h: Any) -> None:
    snaps = [write(h, keyed("append_new"), customers(range(1, 41)))]
    snaps.append(write(h, keyed("append_new"), customers(range(35, 50), version=3)))
    snaps.append(write(h, keyed("append_always"), customers(range(60, 65))))
    delta = keyed("replace", delta=Delta(source="raw", watermark="seq"))
    snaps.append(write(h, delta, customers(range(12, 18), version=4), window=Window(10, 20)))
    snaps.append(write(h, keyed("replace"), customers(range(5, 30), version=5)))
    table = h.table("up")
    for a in [None, *snaps]:
        for b in snaps:
            check(table, a, b, KEY)


def test_compaction_is_an_empty_change_read_from_metadata_alone(h: Any) -> None:
    spec = keyed("snapshot_replace", "merge-on-read")
    write(h, spec, customers(range(1, 101)))
    for v in range(1, 4):
        before = write(h, spec, customers(range(v, v + 3), version=v))
    h.store().compact(spec, min_input_files=1)
    after = head(h, "up")
    assert after != before
    table = h.table("up")
    assert table.snapshot_by_id(after).summary.operation.value == "replace"
    got = read_changes(table, from_snapshot=before, primary_key=KEY)
    assert got.frame.height == 0
    check(table, None, after, KEY)


def test_schema_evolution_reads_both_states_under_the_to_schema_by_field_id(h: Any) -> None:
    spec = keyed("snapshot_replace", "merge-on-read")
    s1 = write(h, spec, customers(range(1, 31)))
    table = h.table("up")
    with table.update_schema() as update:
        update.rename_column("name", "label")
        update.delete_column("day")
    frame = customers(range(1, 4), version=1).rename({"name": "label"}).drop("day")
    s2 = write(h, spec, frame.with_columns(extra=pl.lit("x")))
    table = h.table("up")
    assert "label" in table.schema().column_names and "extra" in table.schema().column_names
    counts = check(table, s1, s2, KEY)
    assert counts["update_after"] == 3
    # the contract (docs/concepts.md "Schema changes upstream"): before rows under `to`'s names
    frame = read_changes(table, from_snapshot=s1, to_snapshot=s2, primary_key=KEY).frame
    assert "name" not in frame.columns and "day" not in frame.columns
    before = frame.filter(pl.col(CHANGE_TYPE) == "update_before").sort("id")
    assert before.get_column("label").to_list() == ["c1-v0", "c2-v0", "c3-v0"]
    assert before.get_column("extra").null_count() == 3
    check(table, s2, s1, KEY)


def test_an_unkeyed_table_reads_as_a_multiset_difference_counting_duplicates(h: Any) -> None:
    spec = unkeyed("append_always")
    rows = customers([1, 1, 2, 3]).drop("seq")
    s1 = write(h, spec, rows)
    s2 = write(h, spec, customers([1, 4]).drop("seq"))
    s3 = write(h, unkeyed("replace"), customers([1, 2, 2]).drop("seq"))
    table = h.table("flat")
    assert check(table, s1, s2, [])["insert"] == 2
    assert check(table, s2, s3, []) == {
        "insert": 1,
        "delete": 4,
        "update_before": 0,
        "update_after": 0,
    }
    check(table, s3, s1, [])


# --- the property: random sequences of writes, any pair of snapshots ---------------------------

DAY = "day(day)"


@dataclasses.dataclass
class Upstream:
    """One table under random writes: its snapshots so far and its schema's evolution."""

    name: str
    key: list[str]
    snaps: list[int] = dataclasses.field(default_factory=list)
    renamed: bool = False  # name -> label
    dropped: bool = False  # amount dropped
    added: bool = False  # extra added
    fresh: int = 1000

    def spec(self, strategy: str, hint: str = "auto", **kw: Any) -> DatasetSpec:
        return DatasetSpec(
            name=self.name,
            primary_key=tuple(self.key),
            strategy=strategy,  # type: ignore[arg-type]
            write_strategy_hint=hint,  # type: ignore[arg-type]
            partition_by=(DAY,) if self.key else None,
            **kw,
        )

    def rows(self, ids: Any, version: int) -> pl.DataFrame:
        frame = customers(ids, version=version).with_columns(day=day_of(pl.col("id")))
        if self.renamed:
            frame = frame.rename({"name": "label"})
        if self.dropped:
            frame = frame.drop("amount")
        if self.added:
            frame = frame.with_columns(extra=pl.lit(f"e{version}"))
        return frame


def day_of(i: Any) -> Any:
    """Three days: partitions of several rows, so a write keeps most of a file's rows."""
    return pl.date(2024, 1, 1) + pl.duration(days=i % 3)


WRITES = ("upsert", "sync", "replace", "append_new", "append", "window", "slice")
KEYED_STEPS = st.one_of(
    st.tuples(
        st.sampled_from(WRITES),
        st.sampled_from(["copy-on-write", "merge-on-read", "auto"]),
        st.sets(st.integers(1, 30), min_size=1, max_size=12),
        st.integers(0, 3),
    ),
    st.tuples(st.sampled_from(["compact", "rename", "drop", "add", "rollback"])),
)
UNKEYED_STEPS = st.one_of(
    st.tuples(
        st.sampled_from(["append", "replace", "window"]),
        st.just("auto"),
        st.lists(st.integers(1, 6), min_size=1, max_size=6),
        st.integers(0, 1),
    ),
    st.tuples(st.sampled_from(["compact", "rollback"])),
)


def apply(h: Any, up: Upstream, step: tuple[Any, ...], pick: Any) -> None:
    kind = step[0]
    table = h.table(up.name) if up.snaps else None
    if kind in ("rename", "drop", "add"):
        if table is None or {"rename": up.renamed, "drop": up.dropped, "add": up.added}[kind]:
            return
        with table.update_schema() as update:
            if kind == "rename":
                update.rename_column("name", "label")
            elif kind == "drop":
                update.delete_column("amount")
            else:
                update.add_column("extra", StringType())
        setattr(up, {"rename": "renamed", "drop": "dropped", "add": "added"}[kind], True)
        return
    if kind == "compact":
        if table is not None:
            h.store().compact(up.spec("replace"), min_input_files=1)
    elif kind == "rollback":
        if table is not None and len(up.snaps) > 1:
            target = pick(st.sampled_from(up.snaps))
            table.manage_snapshots().set_current_snapshot(target).commit()
    else:
        _, hint, ids, version = step
        ids = sorted(ids) if up.key else list(ids)
        if kind == "upsert":
            h.store().write(up.spec("snapshot_replace", hint), up.rows(ids, version))
        elif kind in ("sync", "replace", "append_new"):
            h.store().write(up.spec(kind, hint), up.rows(ids, version))
        elif kind == "append":
            fresh = list(range(up.fresh, up.fresh + len(ids))) if up.key else ids
            up.fresh += len(ids)
            h.store().write(up.spec("append_always"), up.rows(fresh, version))
        elif kind == "window":
            low = min(ids)
            inside = [i for i in ids if low < i <= low + 10] or [low + 1]
            spec = up.spec("replace", hint, delta=Delta(source="raw", watermark="seq"))
            h.store().write(spec, up.rows(inside, version), window=Window(low, low + 10))
        elif kind == "slice":
            day = date(2024, 1, 1 + min(ids) % 3)
            same = [i for i in ids if i % 3 == min(ids) % 3]
            start = datetime(day.year, day.month, day.day, tzinfo=UTC)
            part = PartitionSlice(day.isoformat(), (TimeRange("day", start, start + timedelta(1)),))
            h.store().write(up.spec("replace", hint), up.rows(same, version), partition=part)
    now = h.table(up.name).current_snapshot()
    if now is not None and (not up.snaps or now.snapshot_id != up.snaps[-1]):
        up.snaps.append(now.snapshot_id)


COUNTER = iter(range(10**6))


@pytest.mark.parametrize("keyed_upstream", [True, False], ids=["keyed", "unkeyed"])
def test_any_pair_of_snapshots_after_random_writes_reads_as_the_oracle_difference(
    h: Any, keyed_upstream: bool
) -> None:
    @settings(
        max_examples=12 if keyed_upstream else 8,
        deadline=None,
        phases=[Phase.explicit, Phase.reuse, Phase.generate],  # no shrinking: minutes here
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(
        steps=st.lists(KEYED_STEPS if keyed_upstream else UNKEYED_STEPS, min_size=2, max_size=7),
        data=st.data(),
    )
    def run(steps: list[tuple[Any, ...]], data: st.DataObject) -> None:
        up = Upstream(name=f"t{next(COUNTER)}", key=KEY if keyed_upstream else [])
        first = ("replace", "auto", set(range(1, 25)) if keyed_upstream else [1, 2, 2, 3], 0)
        for step in [first, *steps]:
            apply(h, up, step, data.draw)
            table = h.table(up.name)
            to = table.current_snapshot().snapshot_id
            check(table, up.snaps[-2] if len(up.snaps) > 1 else None, to, up.key)
            a = data.draw(st.sampled_from([None, *up.snaps]))
            b = data.draw(st.sampled_from(up.snaps))
            check(table, a, b, up.key)

    before = dict(COMPOSED)
    run()
    if keyed_upstream:  # the composed path was exercised, not only the fallback
        assert COMPOSED["composed"] > before["composed"]


def test_the_to_snapshot_defaults_to_the_branch_head_and_a_missing_branch_is_refused(
    h: Any,
) -> None:
    s1 = write(h, keyed("snapshot_replace"), customers(range(1, 5)))
    h.store().write(keyed("snapshot_replace"), customers(range(1, 3), version=1), branch="audit")
    table = h.table("up")
    staged = read_changes(table, from_snapshot=s1, primary_key=KEY, branch="audit")
    assert staged.counts["update_after"] == 2
    assert read_changes(table, from_snapshot=s1, primary_key=KEY).frame.height == 0
    with pytest.raises(ChangesUnsupported, match="no branch 'nope'"):
        read_changes(table, from_snapshot=s1, primary_key=KEY, branch="nope")


# --- change files written at write time (`commit.CHANGE_FILE`) ---------------------------------


def change_file(h: Any, snapshot_id: int) -> str | None:
    summary = h.table("up").snapshot_by_id(snapshot_id).summary
    return summary.get(CHANGE_FILE) if summary is not None else None


@pytest.mark.parametrize(
    ("mode", "consumed", "recorded"),
    [
        ("always", False, True),
        ("never", True, False),
        ("auto", True, True),  # a downstream consumes the table's changes
        ("auto", False, False),  # nobody does: no before rows read, no change file
    ],
)
def test_the_change_files_property_and_a_consumer_decide_whether_an_upsert_records_its_change(
    h: Harness, mode: str, consumed: bool, recorded: bool
) -> None:
    asked: list[str] = []

    def consumers(dataset: str) -> bool:
        asked.append(dataset)
        return consumed

    h = dataclasses.replace(h, change_consumers=consumers)
    spec = keyed("sync", "merge-on-read")
    s1 = write(h, spec, customers(range(1, 201)))
    assert h.table("up").snapshot_by_id(s1).summary.get(CHANGE_ADDED) == "inserts"
    if mode != "auto":
        with h.table("up").transaction() as tx:
            tx.set_properties({CHANGE_FILES_PROPERTY: mode})
    asked.clear()
    s2 = write(h, spec, pl.concat([customers(range(3, 150), version=1), customers([500])]))
    assert (change_file(h, s2) is not None) == recorded
    assert asked == (["up"] if mode == "auto" else [])  # asked once, and only when it decides
    counts = check(h.table("up"), s1, s2, KEY)  # composed or diffed: the same
    assert counts == {"insert": 1, "delete": 53, "update_before": 147, "update_after": 147}
    if not recorded:
        with pytest.raises(ChangesUnsupported, match="no change files"):
            read_changes(h.table("up"), from_snapshot=s1, primary_key=KEY, composed=True)


def test_asked_columns_are_the_full_change_projected_on_every_path(h: Harness) -> None:
    """`columns` projects the change (as delta-rs `load_cdf(columns=...)`): the same rows and
    counts as the whole change — an update of columns not asked still shows, with equal values —
    read from the one change file, composed over two, or diffed; an unknown column is refused."""
    h = dataclasses.replace(h, change_consumers=lambda dataset: True)
    spec = keyed("sync", "merge-on-read")
    s1 = write(h, spec, customers(range(1, 101)))
    s2 = write(h, spec, pl.concat([customers(range(3, 60), version=1), customers([500])]))
    s3 = write(h, spec, pl.concat([customers(range(40, 80), version=2), customers([600])]))
    table = h.table("up")
    asked = ["day", "id"]  # `day` does not change with the version: the updates are elsewhere
    extra = [CHANGE_TYPE, CHANGE_SNAPSHOT, CHANGE_COMMIT_TIME]
    for start, end in [(s1, s2), (s2, s3), (s1, s3), (None, s3)]:
        for composed in (None, True, False):
            if composed and start is None:
                continue  # nothing to compose from the empty table
            whole = read_changes(table, from_snapshot=start, to_snapshot=end, primary_key=KEY)
            got = read_changes(
                table,
                from_snapshot=start,
                to_snapshot=end,
                primary_key=KEY,
                composed=composed,
                columns=asked,
            )
            assert got.frame.columns == [*asked, *extra]
            assert got.counts == whole.counts
            assert got.counts["update_after" if start else "insert"] > 0
            assert canonical(got.frame) == canonical(whole.frame.select(*asked, *extra))
    with pytest.raises(ChangesUnsupported, match=r"column.*'nope'.*not in its schema"):
        read_changes(table, from_snapshot=s1, primary_key=KEY, columns=["id", "nope"])


def test_a_change_file_on_a_local_warehouse_is_one_uncompressed_row_group(h: Harness) -> None:
    """Read through a memory map, an uncompressed change file is the cheapest to read cold, and
    one row group reads back as one chunk per column."""
    import pyarrow.parquet as pq

    h = dataclasses.replace(h, change_consumers=lambda dataset: True)
    spec = keyed("sync", "merge-on-read")
    s1 = write(h, spec, customers(range(1, 101)))
    s2 = write(h, spec, pl.concat([customers(range(3, 60), version=1), customers([500])]))
    path = change_file(h, s2)
    assert path is not None and path.startswith("file:")
    meta = pq.ParquetFile(path.removeprefix("file://")).metadata
    codecs = {
        meta.row_group(g).column(c).compression
        for g in range(meta.num_row_groups)
        for c in range(meta.num_columns)
    }
    assert codecs == {"UNCOMPRESSED"} and meta.num_row_groups == 1
    assert read_changes(h.table("up"), from_snapshot=s1, primary_key=KEY).frame.n_chunks() == 1
    check(h.table("up"), s1, s2, KEY)


def test_a_large_change_file_is_still_one_row_group(tmp_path: Any) -> None:
    import pyarrow.parquet as pq
    from pyiceberg.io.pyarrow import PyArrowFileIO

    from pipeline_output.stores.iceberg.snapshot.commit import write_change_file

    change = pl.DataFrame({"id": range(300_000)}).with_columns(pl.lit("insert").alias(CHANGE_TYPE))
    write_change_file(PyArrowFileIO(), f"file://{tmp_path}/c.parquet", change)
    assert pq.ParquetFile(tmp_path / "c.parquet").metadata.num_row_groups == 1
    assert pl.read_parquet(tmp_path / "c.parquet").n_chunks() == 1


def test_a_change_file_that_cannot_be_written_fails_the_write_and_commits_nothing(
    h: Any,
) -> None:
    spec = keyed("snapshot_replace", "copy-on-write")
    s1 = write(h, spec, customers(range(1, 50)))
    location = h.table("up").location().removeprefix("file://")
    blocker = f"{location}/data/changes"
    with open(blocker, "w") as f:  # a file where the change files' directory goes
        f.write("not a directory")
    files = len(list(h.table("up").scan().plan_files()))
    with pytest.raises(OSError):
        h.store().write(spec, customers(range(1, 5), version=1), run_id="r")
    assert head(h, "up") == s1 and len(list(h.table("up").scan().plan_files())) == files
