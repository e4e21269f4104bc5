"""Issue 17, items 6 and 7: column names that collide with the merge's internals, and raw errors.

6. The prefix `__po_` is reserved on both arms (refused up front, nothing written), and every name
   the merge uses lives inside it, so any other valid column (`v__new` beside `v`) just works.
7. NUL characters in strings (the legacy arm refuses, Iceberg stores them), a pyarrow table with
   duplicate column names (both arms refuse) and a key too long for the legacy arm's key index
   (a clear error naming the key, not "cannot stage 2 columns") become the project's own errors.

Real Postgres and a real pyiceberg SQL catalog; no mocks. Every write strategy runs twice.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import polars as pl
import psycopg
import pyarrow as pa
import pytest

from pipeline_output import DatasetSpec, IcebergStore
from pipeline_output.errors import BadInput, DuplicateKeys
from pipeline_output.infra.locks import AdvisoryLock
from pipeline_output.services.publish import Publisher, ResolvedMode
from pipeline_output.stores.postgres import PostgresStore
from pipeline_output_tests.oracle import assert_same_multiset

Store = IcebergStore | PostgresStore


@pytest.fixture
def ice(catalog: Any, pg_db_url: str) -> IcebergStore:
    return IcebergStore(catalog, "datasets", lock=AdvisoryLock(pg_db_url))


@pytest.fixture
def pg(pg_db_url: str) -> PostgresStore:
    store = PostgresStore(pg_db_url)
    store.ensure_schema()
    return store


@pytest.fixture(params=["iceberg", "pg"])
def store(request: pytest.FixtureRequest, ice: IcebergStore, pg: PostgresStore) -> Store:
    return ice if request.param == "iceberg" else pg


def _pg_rows(url: str, dataset: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT row_index, pk, data::text FROM pipeline_output.dataset_rows"
            " WHERE dataset_id = %s ORDER BY row_index",
            (dataset,),
        ).fetchall()


@contextmanager
def nothing_written(store: Store, spec: DatasetSpec, pg_db_url: str) -> Iterator[None]:
    """The dataset (or its absence) is exactly the same after the block, on either arm."""
    if isinstance(store, IcebergStore):
        table = store.load(spec)
        snapshots = [s.snapshot_id for s in table.snapshots()] if table is not None else None
        before = store.read(spec) if table is not None and snapshots else None
        yield
        after_table = store.load(spec)
        if table is None:
            assert after_table is None, "a refused first write must not create the table"
            return
        assert after_table is not None
        assert [s.snapshot_id for s in after_table.snapshots()] == snapshots
        if before is not None:
            assert_same_multiset(store.read(spec), before)
    else:
        first = store.target_state(spec).first_deploy
        rows = _pg_rows(pg_db_url, spec.name)
        yield
        assert store.target_state(spec).first_deploy == first
        assert _pg_rows(pg_db_url, spec.name) == rows, "a refused write must not touch the rows"


def _upsert_oracle(old: pl.DataFrame, new: pl.DataFrame, key: str) -> pl.DataFrame:
    """snapshot_replace on a re-deploy: target rows with keys absent from `new` stay, the rest is `new`."""
    return pl.concat([old.filter(~pl.col(key).is_in(new[key].implode())), new])


# --- item 6: reserved names ----------------------------------------------------------------------


def _suffix_frame(ids: range, version: int) -> pl.DataFrame:
    """Columns named like the merge's old internals (`v__new`, `v__po_new__`, `len`) beside `v`."""
    return pl.DataFrame(
        {
            "id": list(ids),
            "v": [f"v{i}-{version}" for i in ids],
            "v__new": [i * 10 + version for i in ids],
            "v__po_new__": [f"x{i}-{version}" for i in ids],
            "len": [float(i + version) for i in ids],
        }
    )


@pytest.mark.parametrize("strategy", ["snapshot_replace", "sync"])
def test_column_named_like_a_join_suffix_upserts_and_syncs_correctly_twice_on_both_arms(
    store: Store, strategy: str
) -> None:
    spec = DatasetSpec(name="suffixed", primary_key=("id",), strategy=strategy)
    first = _suffix_frame(range(1, 11), version=0)
    store.write(spec, first)
    assert_same_multiset(store.read(spec), first)
    # keys 1-5 keep their rows, 6-10 change, 11-14 are new (sync deletes 1-5)
    second = pl.concat(
        [_suffix_frame(range(6, 8), version=0), _suffix_frame(range(8, 15), version=1)]
    )
    expected = second if strategy == "sync" else _upsert_oracle(first, second, "id")
    for _ in range(2):  # the rerun is safe: same table
        store.write(spec, second)
        assert_same_multiset(store.read(spec), expected)
    # and again with changed values only in the suffix-named columns
    third = second.with_columns(pl.col("v__new") + 1000, pl.col("v__po_new__") + "!")
    expected = third if strategy == "sync" else _upsert_oracle(expected, third, "id")
    for _ in range(2):
        store.write(spec, third)
        assert_same_multiset(store.read(spec), expected)


@pytest.mark.parametrize("column", ["__po_pos__", "__po_hit__", "__po_x", "__po_new__v"])
def test_reserved_po_prefix_column_is_refused_on_both_arms_and_nothing_is_written(
    store: Store, pg_db_url: str, column: str
) -> None:
    spec = DatasetSpec(name="reserved", primary_key=("id",), strategy="snapshot_replace")
    frame = pl.DataFrame({"id": [1, 2], "v": ["a", "b"], column: [1, 2]})
    with nothing_written(store, spec, pg_db_url), pytest.raises(BadInput) as err:
        store.write(spec, frame)  # first deploy: no table created
    msg = str(err.value)
    assert "reserved" in msg and "'reserved'" in msg and repr(column) in msg and "__po_" in msg
    good = frame.drop(column)
    for _ in range(2):
        store.write(spec, good)
    with nothing_written(store, spec, pg_db_url), pytest.raises(BadInput, match=column):
        store.write(spec, frame.with_columns(pl.col("v") + "!"))  # a re-deploy: table unchanged
    assert_same_multiset(store.read(spec), good)


def test_reserved_po_prefix_key_column_is_refused_on_both_arms(
    store: Store, pg_db_url: str
) -> None:
    spec = DatasetSpec(name="reserved_key", primary_key=("__po_pos__",))
    with nothing_written(store, spec, pg_db_url), pytest.raises(BadInput, match="__po_pos__"):
        store.write(spec, pl.DataFrame({"__po_pos__": [1, 2], "v": ["a", "b"]}))


def test_key_column_named_len_with_duplicate_keys_is_reported_as_duplicate_keys(
    store: Store, pg_db_url: str
) -> None:
    spec = DatasetSpec(name="len_key", primary_key=("len",))
    frame = pl.DataFrame({"len": [1, 1, 2], "v": ["a", "b", "c"]})
    with nothing_written(store, spec, pg_db_url), pytest.raises(DuplicateKeys, match="len_key"):
        store.write(spec, frame)


# --- item 7a: NUL characters ---------------------------------------------------------------------


@pytest.mark.parametrize("column", ["id", "note"])
def test_nul_in_a_string_column_is_refused_by_the_legacy_arm_before_any_write(
    pg: PostgresStore, pg_db_url: str, column: str
) -> None:
    spec = DatasetSpec(name="nul_text", primary_key=("id",))
    clean = pl.DataFrame({"id": ["a", "b"], "note": ["x", "y"]})
    bad = clean.with_columns(pl.Series(column, [clean[column][0], "b\x00c"]))
    with nothing_written(pg, spec, pg_db_url), pytest.raises(BadInput) as err:
        pg.write(spec, bad)  # first deploy
    msg = str(err.value)
    assert "'nul_text'" in msg and repr(column) in msg and "NUL" in msg and "Postgres" in msg
    for _ in range(2):
        pg.write(spec, clean)
    with nothing_written(pg, spec, pg_db_url), pytest.raises(BadInput, match="NUL"):
        pg.write(spec, bad)  # re-deploy
    assert_same_multiset(pg.read(spec), clean)


def test_nul_in_strings_round_trips_on_the_iceberg_arm(ice: IcebergStore) -> None:
    spec = DatasetSpec(name="nul_text", primary_key=("id",), strategy="snapshot_replace")
    frame = pl.DataFrame({"id": ["a", "b\x00c", "\x00"], "note": ["x\x00y", None, "\x00\x00"]})
    for _ in range(2):
        ice.write(spec, frame)
        assert_same_multiset(ice.read(spec), frame)
    changed = frame.with_columns(pl.col("note").fill_null("z\x00"))
    for _ in range(2):
        ice.write(spec, changed)
        assert_same_multiset(ice.read(spec), changed)


def test_nul_in_strings_in_dual_mode_is_refused_before_either_arm_writes(
    ice: IcebergStore, pg: PostgresStore, pg_db_url: str
) -> None:
    spec = DatasetSpec(name="nul_dual", primary_key=("id",))
    publisher = Publisher(iceberg=ice, postgres=pg)
    with (
        nothing_written(ice, spec, pg_db_url),
        nothing_written(pg, spec, pg_db_url),
        pytest.raises(BadInput, match="NUL"),
    ):
        publisher.publish(
            spec,
            pl.DataFrame({"id": [1, 2], "note": ["ok", "bad\x00"]}),
            mode=ResolvedMode("dual", "run config"),
        )


# --- item 7b: duplicate column names -------------------------------------------------------------


def test_pyarrow_table_with_duplicate_column_names_is_refused_on_both_arms(
    store: Store, pg_db_url: str
) -> None:
    spec = DatasetSpec(name="dup_cols", primary_key=("id",))
    table = pa.table(
        [pa.array([1, 2]), pa.array(["x", "y"]), pa.array([3, 4])], names=["id", "a", "a"]
    )
    with nothing_written(store, spec, pg_db_url), pytest.raises(BadInput) as err:
        store.write(spec, table)
    msg = str(err.value)
    assert "'dup_cols'" in msg and "'a'" in msg and "duplicate" in msg
    good = pa.table([pa.array([1, 2]), pa.array(["x", "y"])], names=["id", "a"])
    for _ in range(2):
        store.write(spec, good)
    with nothing_written(store, spec, pg_db_url), pytest.raises(BadInput, match="'a'"):
        store.write(spec, table)
    batch = pa.record_batch([pa.array([1]), pa.array([2]), pa.array([3])], names=["id", "b", "b"])
    with nothing_written(store, spec, pg_db_url), pytest.raises(BadInput, match="'b'"):
        store.write(spec, batch)


# --- item 7c: a key too long for the legacy arm's key index --------------------------------------


def _long_key() -> str:
    return secrets.token_hex(2500)  # 5,000 incompressible characters


def test_key_too_long_for_the_legacy_key_index_is_a_clear_error_and_nothing_is_written(
    pg: PostgresStore, pg_db_url: str
) -> None:
    spec = DatasetSpec(name="long_key", primary_key=("id",))
    bad = pl.DataFrame({"id": ["short", _long_key()], "v": [1, 2]})
    with nothing_written(pg, spec, pg_db_url), pytest.raises(BadInput) as err:
        pg.write(spec, bad)  # first deploy
    msg = str(err.value)
    assert "'long_key'" in msg and "'id'" in msg and "too long" in msg and "2704" in msg
    assert "cannot stage" not in msg
    clean = bad.head(1)
    for _ in range(2):
        pg.write(spec, clean)
    with nothing_written(pg, spec, pg_db_url), pytest.raises(BadInput, match="too long"):
        pg.write(spec, bad)  # re-deploy
    assert_same_multiset(pg.read(spec), clean)


def test_composite_key_too_long_for_the_legacy_key_index_names_every_key_column(
    pg: PostgresStore, pg_db_url: str
) -> None:
    spec = DatasetSpec(name="long_pair", primary_key=("a", "b"), strategy="sync")
    bad = pl.DataFrame({"a": [1, 2], "b": ["short", _long_key()]})
    with nothing_written(pg, spec, pg_db_url), pytest.raises(BadInput) as err:
        pg.write(spec, bad)
    msg = str(err.value)
    assert "'long_pair'" in msg and "'a'" in msg and "'b'" in msg and "too long" in msg


def test_key_longer_than_the_legacy_limit_is_stored_by_the_iceberg_arm(ice: IcebergStore) -> None:
    spec = DatasetSpec(name="long_key", primary_key=("id",), strategy="snapshot_replace")
    frame = pl.DataFrame({"id": ["short", _long_key()], "v": [1, 2]})
    for _ in range(2):
        ice.write(spec, frame)
        assert_same_multiset(ice.read(spec), frame)
