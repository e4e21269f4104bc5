"""Model-based test of incremental downstreams (issue 46), through the service layer.

Random sequences of upstream writes — upsert (copy-on-write and merge-on-read), replace,
append, append_new, sync, a Dagster partition's slice (a sync inside it), a delta window's
replace, write-audit-publish (a staged write is invisible until published), a column added
(schema evolution) — compactions, expiries (kept for the downstream, or forced), rollbacks, and
runs of a downstream per-group aggregate (recomputed for the changed groups only, a group with no
row left deleted), some of which fail: the compute raises (nothing recorded: the next run reads
the same range) or the run is killed between the downstream's commit and the ledger record (the
next run repairs the ledger and does not consume the range twice).

The oracle is plain Python: the upstream's rows after each write as the write's semantics say,
remembered per upstream snapshot. After every run: its range starts where the previous one ended
(or is a full refresh: the first run, or after a forced expiry of its start), its changes equal
the difference by key of the model as of its two snapshots, and the downstream's table equals the
aggregate of the model as of the range's end (its full recompute).

Examples: `PIPELINE_OUTPUT_HYPOTHESIS_EXAMPLES` (default 8; the `deep` profile of
`PIPELINE_OUTPUT_HYPOTHESIS_PROFILE` runs 60); the slow variant (`pytest -m slow`) runs 80 longer
sequences.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import replace
from datetime import timedelta
from typing import Any

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline_output import DatasetSpec, Delta, Window
from pipeline_output.contract.slices import Equals, PartitionSlice
from pipeline_output.services.audit import publish_audit
from pipeline_output.services.incremental import (
    CHANGE_TYPE,
    Changes,
    ConsumeRequest,
    consume_changes,
)
from pipeline_output.services.maintenance import MaintenanceOptions, maintain
from pipeline_output.services.time_travel import rollback
from pipeline_output.stores.iceberg.table.tables import ancestry, head

GROUPS = ["a", "b", "c"]
KEYS = 8
_names = itertools.count()

Row = tuple[str, int, str | None]  # grp, amount, note

row_st = st.tuples(st.integers(0, KEYS - 1), st.sampled_from(GROUPS), st.integers(0, 3))
rows_st = st.lists(row_st, max_size=6)
op_st = st.one_of(
    st.tuples(
        st.sampled_from(
            ["upsert_cow", "upsert_mor", "replace", "append", "append_new", "sync", "evolve"]
        ),
        rows_st,
    ),
    st.tuples(st.just("slice"), st.sampled_from(GROUPS), rows_st),
    # a windowed replace over the watermark `id`: (low, low + width]
    st.tuples(st.just("window"), st.integers(-1, KEYS - 2), st.integers(1, 4), rows_st),
    # write-audit-publish: an upsert staged on a branch, published or not
    st.tuples(st.just("audit"), rows_st, st.booleans()),
    st.tuples(st.just("compact")),
    st.tuples(st.just("expire"), st.booleans()),
    st.tuples(st.just("rollback"), st.integers(1, 3)),
    st.tuples(st.just("run"), st.sampled_from([None, None, None, "raise", "kill"])),
)


def _settings() -> Any:
    deep = os.environ.get("PIPELINE_OUTPUT_HYPOTHESIS_PROFILE") == "deep"
    examples = int(os.environ.get("PIPELINE_OUTPUT_HYPOTHESIS_EXAMPLES", 60 if deep else 8))
    return settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        print_blob=True,
    )


class Killed(BaseException):
    """A run killed between the downstream's commit and the ledger record."""


class Model:
    """The upstream as the writes' semantics say, per snapshot; the downstream's position."""

    def __init__(
        self, runtime: Any, *, down_mode: str = "iceberg", up_mode: str = "iceberg"
    ) -> None:
        n = next(_names)
        self.runtime = runtime
        self.up = DatasetSpec(name=f"orders_{n}", primary_key=("id",), mode=up_mode)  # type: ignore[arg-type]
        self.up = replace(self.up, allow_empty=True)
        self.down = DatasetSpec(
            name=f"totals_{n}", primary_key=("grp",), strategy="sync", mode=down_mode
        )
        self.rows: dict[int, Row] = {}
        self.states: dict[int, dict[int, Row]] = {}
        self.evolved = False
        self.position: int | None = None  # the upstream snapshot the downstream consumed to
        self.expired_position = False
        self.runs = 0

    # -- the upstream

    def _frame(self, rows: dict[int, Row]) -> pl.DataFrame:
        data: dict[str, Any] = {
            "id": list(rows),
            "grp": [r[0] for r in rows.values()],
            "amount": [r[1] for r in rows.values()],
        }
        schema: dict[str, Any] = {"id": pl.Int64, "grp": pl.String, "amount": pl.Int64}
        if self.evolved:
            data["note"] = [r[2] for r in rows.values()]
            schema["note"] = pl.String
        return pl.DataFrame(data, schema=schema)

    def _table(self) -> Any:
        return self.runtime.iceberg.load(self.up)

    def _head(self) -> int | None:
        table = self._table()
        return head(table) if table is not None else None

    def _downstream_head(self) -> int | None:
        table = self.runtime.iceberg.load(self.down)
        return head(table) if table is not None else None

    def _remember(self) -> None:
        now = self._head()
        if now is not None:
            self.states[now] = dict(self.rows)

    def write(self, kind: str, drawn: list[tuple[int, str, int]], group: str | None = None) -> None:
        note = "n" if kind == "evolve" else None
        batch = {i: (g if group is None else group, a, note) for i, g, a in drawn}
        if kind == "evolve":
            self.evolved = True
        first = self._head() is None
        spec = self.up
        publisher = self.runtime.publisher
        mode = publisher.resolve(spec)
        if kind == "append":
            batch = {i: r for i, r in batch.items() if i not in self.rows}
            spec = replace(spec, strategy="append_always")
        elif kind in ("replace", "sync", "append_new"):
            spec = replace(spec, strategy=kind)
        elif kind == "upsert_mor":
            spec = replace(spec, write_strategy_hint="merge-on-read")
        elif kind == "upsert_cow":
            spec = replace(spec, write_strategy_hint="copy-on-write")
        frame = self._frame(batch)
        if kind == "slice" and group is not None:
            part = PartitionSlice(key=group, terms=(Equals("grp", group),))
            publisher.publish(spec, frame, mode=mode, partition=part)
        else:
            publisher.publish(spec, frame, mode=mode)
        if first or kind in ("replace", "sync"):
            self.rows = dict(batch)
        elif kind == "append_new":
            self.rows.update({i: r for i, r in batch.items() if i not in self.rows})
        elif kind == "slice":
            self.rows = {i: r for i, r in self.rows.items() if r[0] != group or i in batch}
            self.rows.update(batch)
        else:
            self.rows.update(batch)
        self._remember()

    def window(self, low: int, width: int, drawn: list[tuple[int, str, int]]) -> None:
        high = min(low + width, KEYS - 1)
        inside = [(i, g, a) for i, g, a in drawn if low < i <= high]
        batch = {i: (g, a, None) for i, g, a in inside}
        first = self._head() is None
        spec = replace(self.up, strategy="replace", delta=Delta(source="raw", watermark="id"))
        publisher = self.runtime.publisher
        frame = self._frame(batch)
        publisher.publish(
            spec,
            frame,
            mode=publisher.resolve(self.up),
            window=Window(low if low >= 0 else None, high),
        )
        if first:
            self.rows = dict(batch)
        else:
            self.rows = {i: r for i, r in self.rows.items() if not (low < i <= high)}
            self.rows.update(batch)
        self._remember()

    def audit(self, drawn: list[tuple[int, str, int]], publish: bool) -> None:
        if self._head() is None:
            return
        batch = {i: (g, a, None) for i, g, a in drawn}
        publisher = self.runtime.publisher
        run_id = f"audit-{self.up.name}-{self.runs}"
        self.runs += 1
        publisher.publish(
            self.up, self._frame(batch), mode=publisher.resolve(self.up), audit=True, run_id=run_id
        )
        # staged on a branch: main, and so the changes a downstream reads, unchanged
        if publish:
            publish_audit(publisher, self.up, run_id=run_id, windows=self.runtime.windows)
            self.rows.update(batch)
        self._remember()

    def compact(self) -> None:
        if self._table() is None:
            return
        self.runtime.iceberg.compact(self.up, min_input_files=2)
        self._remember()

    def expire(self, force: bool) -> None:
        if self._table() is None:
            return
        options = MaintenanceOptions(
            audits=False,
            compact=False,
            orphans=False,
            older_than=timedelta(0),
            force=force,
        )
        maintain(self.runtime.iceberg, [self.up], options=options, ledger=self.runtime.windows)
        table = self._table()
        gone = self.position is not None and table.snapshot_by_id(self.position) is None
        if gone and not self.expired_position:
            assert force, "expiry removed a snapshot the downstream had not consumed past"
            self.expired_position = True

    def rollback(self, back: int) -> None:
        table = self._table()
        if table is None:
            return
        history = [s.snapshot_id for s in ancestry(table, head(table))]
        if len(history) <= back:
            return
        target = history[back]
        if target not in self.states:
            return
        rollback(self.runtime.publisher, self.up, to_snapshot=target, reason="model")
        self.rows = dict(self.states[target])

    # -- the downstream

    def compute(self, changes: Changes) -> pl.DataFrame:
        assert changes.current is not None
        changed = changes.keys("grp")
        now = (
            changes.current.join(changed.lazy(), on="grp", how="semi")
            .group_by("grp")
            .agg(pl.col("amount").sum().alias("total"), pl.len().cast(pl.Int64).alias("n"))
        )
        return changes.with_deletions(now, "grp")

    def run(self, fail: str | None) -> None:
        seen: list[Changes] = []

        def compute(changes: Changes) -> pl.DataFrame:
            seen.append(changes)
            if fail == "raise":
                raise RuntimeError("the compute failed")
            return self.compute(changes)

        def killed() -> None:
            raise Killed

        publisher = self.runtime.publisher
        request = ConsumeRequest(
            spec=self.down,
            upstream=self.up,
            compute=compute,
            mode=publisher.resolve(self.down),
            upstream_mode=publisher.resolve(self.up),
            run_id=f"run-{self.runs}",
        )
        self.runs += 1
        now = self._head()
        written = self._downstream_head()
        try:
            outcome = consume_changes(
                request,
                publisher=publisher,
                ledger=self.runtime.ledger,
                on_written=killed if fail == "kill" else None,
            )
        except (RuntimeError, Killed) as exc:
            assert fail is not None, exc
            if seen and isinstance(exc, Killed) and self._downstream_head() != written:
                # killed after its commit: the range rides in the downstream's snapshot (a
                # write that committed nothing recorded nothing: the next run reads it again)
                self._check(seen[0], now)
                self.position, self.expired_position = now, False
            return
        if now is None or now == self.position:
            assert outcome.action == "noop" and not seen
            return
        assert len(seen) == 1
        self._check(seen[0], now)
        self.position, self.expired_position = now, False

    def _check(self, changes: Changes, now: int | None) -> None:
        assert changes.to_snapshot == now
        refresh = self.position is None or self.expired_position
        assert changes.full_refresh == refresh, (changes.full_refresh, changes.reason)
        if not refresh:
            assert changes.from_snapshot == self.position  # exactly once: no gap, no overlap
        assert now is not None
        old = {} if refresh else self.states[self.position]  # type: ignore[index]
        new = self.states[now]
        assert _diff(changes.frame) == _expected(old, new, changes.frame.columns)
        # the downstream equals its full recompute from the upstream as of `to`
        stored = self.runtime.iceberg.read(self.down).sort("grp")
        assert stored.select("grp", "total", "n").rows() == _aggregate(new)


def _diff(frame: pl.DataFrame) -> dict[str, set[tuple[Any, ...]]]:
    cols = [c for c in frame.columns if not c.startswith("_change")]
    out: dict[str, set[tuple[Any, ...]]] = {}
    for kind in ("insert", "delete", "update_before", "update_after"):
        part = frame.filter(pl.col(CHANGE_TYPE) == kind).select(cols)
        out[kind] = set(part.rows())
    return out


def _expected(
    old: dict[int, Row], new: dict[int, Row], columns: list[str]
) -> dict[str, set[tuple[Any, ...]]]:
    cols = [c for c in columns if not c.startswith("_change")]

    def row(i: int, r: Row) -> tuple[Any, ...]:
        values = {"id": i, "grp": r[0], "amount": r[1], "note": r[2]}
        return tuple(values[c] for c in cols)

    out: dict[str, set[tuple[Any, ...]]] = {k: set() for k in ("insert", "delete")}
    out["update_before"], out["update_after"] = set(), set()
    for i, r in new.items():
        if i not in old:
            out["insert"].add(row(i, r))
        elif row(i, old[i]) != row(i, r):
            out["update_before"].add(row(i, old[i]))
            out["update_after"].add(row(i, r))
    out["delete"] = {row(i, r) for i, r in old.items() if i not in new}
    return out


def _aggregate(rows: dict[int, Row]) -> list[tuple[str, int, int]]:
    totals: dict[str, tuple[int, int]] = {}
    for grp, amount, _ in rows.values():
        total, n = totals.get(grp, (0, 0))
        totals[grp] = (total + amount, n + 1)
    return sorted((g, t, n) for g, (t, n) in totals.items())


def _apply(model: Model, op: tuple[Any, ...]) -> None:
    name = op[0]
    if name == "slice":
        model.write("slice", op[2], group=op[1])
    elif name == "window":
        model.window(op[1], op[2], op[3])
    elif name == "audit":
        model.audit(op[1], op[2])
    elif name == "compact":
        model.compact()
    elif name == "expire":
        model.expire(op[1])
    elif name == "rollback":
        model.rollback(op[1])
    elif name == "run":
        model.run(op[1])
    else:
        model.write(name, op[1])


@pytest.fixture
def runtime(env: str) -> Any:
    from pipeline_output.dagster_layer.resource import get_runtime

    return get_runtime()


@_settings()
@given(ops=st.lists(op_st, min_size=3, max_size=14))
def test_every_run_consumes_the_oracle_changes_once_and_equals_its_recompute(
    runtime: Any, ops: list[tuple[Any, ...]]
) -> None:
    model = Model(runtime)
    for op in [*ops, ("run", None)]:
        _apply(model, op)


@pytest.mark.slow
@settings(_settings(), max_examples=80)
@given(ops=st.lists(op_st, min_size=8, max_size=24))
def test_deep_every_run_consumes_the_oracle_changes_once(
    runtime: Any, ops: list[tuple[Any, ...]]
) -> None:
    """The same, longer sequences and more examples (`pytest -m slow`)."""
    model = Model(runtime)
    for op in [*ops, ("run", None)]:
        _apply(model, op)


def test_a_forced_expiry_makes_the_next_run_a_full_refresh_that_says_why(runtime: Any) -> None:
    model = Model(runtime)
    model.write("upsert_cow", [(1, "a", 1), (2, "b", 2)])
    model.run(None)
    model.write("upsert_cow", [(1, "a", 3)])
    model.expire(force=False)  # kept: the downstream has not consumed past it
    assert not model.expired_position
    model.write("upsert_cow", [(3, "c", 3)])
    model.expire(force=True)
    assert model.expired_position
    model.run(None)  # checked: a full refresh, equal to the recompute
    last = runtime.ledger.consumed_log.last(model.down.name, model.up.name)
    assert last.full_refresh


def test_a_dual_downstream_deletes_and_upserts_the_changed_keys_on_both_arms(runtime: Any) -> None:
    model = Model(runtime, down_mode="dual")
    model.write("upsert_cow", [(1, "a", 1), (2, "b", 2), (3, "b", 1)])
    model.run(None)
    model.write("replace", [(1, "a", 5), (4, "c", 1)])  # b loses every row: deleted downstream
    model.run(None)
    legacy = runtime.postgres.read(model.down).sort("grp")
    assert legacy.select("grp", "total", "n").rows() == _aggregate(model.rows)


def test_a_dual_upstream_serves_its_changes_from_its_iceberg_arm(runtime: Any) -> None:
    model = Model(runtime, up_mode="dual")
    model.write("upsert_mor", [(1, "a", 1), (2, "b", 2)])
    model.run(None)
    model.write("sync", [(1, "a", 4), (3, "b", 1)])
    model.run(None)  # checked against the oracle


def test_an_unkeyed_upstream_changes_as_a_multiset_of_rows(runtime: Any) -> None:
    n = next(_names)
    up = DatasetSpec(name=f"events_{n}", strategy="append_always", mode="iceberg")
    down = DatasetSpec(name=f"counts_{n}", primary_key=("grp",), strategy="sync", mode="iceberg")
    publisher = runtime.publisher
    mode = publisher.resolve(up)
    seen: list[Changes] = []

    def compute(changes: Changes) -> pl.DataFrame:
        seen.append(changes)
        assert changes.current is not None
        now = changes.current.join(changes.keys("grp").lazy(), on="grp", how="semi")
        return changes.with_deletions(now.group_by("grp").agg(pl.len().alias("n")), "grp")

    def run() -> None:
        request = ConsumeRequest(
            spec=down, upstream=up, compute=compute, mode=mode, upstream_mode=mode
        )
        consume_changes(request, publisher=publisher, ledger=runtime.ledger)

    first = pl.DataFrame({"grp": ["a", "a", "b"], "v": [1, 1, 2]})
    publisher.publish(up, first, mode=mode)
    run()
    publisher.publish(up, pl.DataFrame({"grp": ["a", "c"], "v": [1, 3]}), mode=mode)
    run()
    second = seen[-1]
    assert second.counts["insert"] == 2 and second.counts["delete"] == 0
    assert sorted(second.frame.select("grp", "v").rows()) == [("a", 1), ("c", 3)]
    publisher.publish(replace(up, strategy="replace"), first.head(1), mode=mode)
    run()
    third = seen[-1]  # a replace down to one ("a", 1): two of three ("a", 1) go, so do b and c
    assert sorted(third.frame.select("grp", "v").rows()) == [("a", 1), ("a", 1), ("b", 2), ("c", 3)]
    assert set(third.frame.get_column(CHANGE_TYPE)) == {"delete"}
    stored = runtime.iceberg.read(down).sort("grp")
    assert stored.select("grp", "n").rows() == [("a", 1)]
