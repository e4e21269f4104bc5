"""Model-based test of incremental downstreams (issue 46), through the service layer.

Random sequences of rules over an upstream `orders` (keyed by `id`) and the model node's output
`scores` over it, each with a downstream per-group aggregate (recomputed for the changed groups
only, a group with no row left deleted):

- writes to `orders`: upsert copy-on-write and merge-on-read (positional deletes), replace,
  append, append_new, sync, a column added (`evolve`);
- a Dagster partition's slice (`grp == g`) written by snapshot_replace or replace;
- a delta window of a fixed grid applied through the window ledger (`apply_window`: skipped
  when applied already), or restated (its rows replaced);
- another writer's schema change: the added column renamed or dropped (a later `evolve` may
  add it again under its old name: a new field);
- the model node (`score`) scoring `orders` in batches of 1-4 rows: its output replaced in one
  streamed snapshot (`replace_streaming`);
- write-audit-publish: an upsert staged on a branch (invisible), published or not;
- rewrites that change no row: compaction (whole table or one group's files), another writer
  overwriting the table with its own rows;
- expiries (kept for the downstreams, or forced), rollbacks of `orders` (windows after the
  target back to planned);
- downstream runs of either feed, some of which fail: the compute raises (nothing recorded: the
  next run reads the same range) or the run is killed between the downstream's commit and the
  ledger record (the next run repairs the ledger and does not consume the range twice).

The oracle is plain Python: the upstream's rows after each write as the write's semantics say,
by column identity (a field: renames keep it), remembered per upstream snapshot with the schema
it was committed with. After every run: its range starts where the previous one ended (or is a
full refresh: the first run, or after a forced expiry of its start, with a reason saying so),
its changes equal the difference by key of the model as of its two snapshots under the `to`
schema, and the downstream's table equals the aggregate of the model as of the range's end (its
full recompute). An unkeyed upstream (a multiset difference) has its own test below.

Examples: `PIPELINE_OUTPUT_HYPOTHESIS_EXAMPLES` (default 8; the `deep` profile of
`PIPELINE_OUTPUT_HYPOTHESIS_PROFILE` runs 60); the slow variant (`pytest -m slow`) runs 80 longer
sequences. Shrinking a failure takes minutes (`PIPELINE_OUTPUT_HYPOTHESIS_SHRINK=1` turns it on);
`--hypothesis-show-statistics` counts what the examples drew. With `CI=true` hypothesis loads its
`ci` profile: derandomized, the same examples every run.
"""

from __future__ import annotations

import itertools
import os
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

import polars as pl
import pytest
from hypothesis import HealthCheck, Phase, event, example, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from pyiceberg.expressions import EqualTo

from pipeline_output import DatasetSpec, Delta, Window
from pipeline_output.contract.slices import Equals, PartitionSlice
from pipeline_output.contract.spec import Mode
from pipeline_output.services.audit import publish_audit
from pipeline_output.services.incremental import (
    CHANGE_TYPE,
    Changes,
    ConsumeRequest,
    consume_changes,
    pending_changes,
)
from pipeline_output.services.maintenance import MaintenanceOptions, maintain
from pipeline_output.services.model import ROW_INDEX, ModelSpec, score
from pipeline_output.services.time_travel import rollback
from pipeline_output.services.window_apply import ApplyRequest, apply_window
from pipeline_output.stores.iceberg.table.tables import ancestry, head

GROUPS = ["a", "b", "c"]
KEYS = 8
# a windowed upstream's grid over its watermark `id` (0..7): (.., 1], (1, 3], (3, 5], (5, 7]
GRID = [(-1, 1), (1, 3), (3, 5), (5, 7)]
WINDOWS = [Window(None if low < 0 else low, high) for low, high in GRID]
_names = itertools.count()

# A row: its values by column identity (an Iceberg field: a rename keeps it, a column dropped and
# added again under the same name is another one); a state: the rows by key and the schema then
# (field -> its name).
Row = dict[str, Any]
State = tuple[dict[int, Row], dict[str, str]]
BASE = {"id": "id", "grp": "grp", "amount": "amount"}
SCORED = {ROW_INDEX: ROW_INDEX, **BASE}  # the model node's output: its row index, then predict's

row_st = st.tuples(st.integers(0, KEYS - 1), st.sampled_from(GROUPS), st.integers(0, 3))
rows_st = st.lists(row_st, max_size=6)
WRITES = ["upsert_cow", "upsert_mor", "replace", "append", "append_new", "sync", "evolve"]
run_st = st.tuples(
    st.just("run"),
    st.sampled_from([None, None, None, "raise", "kill"]),
    st.sampled_from(["orders", "orders", "scores", "events"]),
)
op_st = st.one_of(
    # one branch per kind of write (one_of draws its branches evenly)
    *[st.tuples(st.just(kind), rows_st) for kind in WRITES],
    # a Dagster partition's slice (`grp == group`) written by snapshot_replace (matched by key)
    # or replace (the slice's rows dropped and written)
    st.tuples(
        st.just("slice"),
        st.sampled_from(GROUPS),
        rows_st,
        st.sampled_from(["snapshot_replace", "replace"]),
    ),
    # a window of the grid applied through the window ledger (skipped when applied already), or
    # restated (its rows replaced)
    st.tuples(st.just("window"), st.integers(0, len(WINDOWS) - 1), rows_st, st.booleans()),
    # another writer's schema change: the added column renamed, or dropped
    st.tuples(st.just("schema"), st.sampled_from(["rename", "drop"])),
    # the unkeyed upstream `events`: rows appended (duplicates kept) or the table replaced
    st.tuples(st.just("events"), st.sampled_from(["append", "replace"]), rows_st),
    # the model node scores the upstream (batches of that many rows) and replaces its output
    st.tuples(st.just("score"), st.integers(1, 4)),
    # write-audit-publish: an upsert staged on a branch, published or not
    st.tuples(st.just("audit"), rows_st, st.booleans()),
    # rewrites (no row changes): compaction, of the table or of one group's files, and another
    # writer overwriting the table with its own rows (pyiceberg: an overwrite, not a replace)
    st.tuples(st.just("compact"), st.sampled_from([None, *GROUPS])),
    st.tuples(st.just("rewrite")),
    st.tuples(st.just("expire"), st.booleans()),
    st.tuples(st.just("rollback"), st.integers(1, 3)),
    st.tuples(st.just("expire"), st.booleans()),
    run_st,
    run_st,
    run_st,
)


def _settings() -> Any:
    deep = os.environ.get("PIPELINE_OUTPUT_HYPOTHESIS_PROFILE") == "deep"
    examples = int(os.environ.get("PIPELINE_OUTPUT_HYPOTHESIS_EXAMPLES", 60 if deep else 8))
    # shrinking a failure takes minutes here (every step writes tables): only when asked
    shrink = os.environ.get("PIPELINE_OUTPUT_HYPOTHESIS_SHRINK") == "1"
    return settings(
        max_examples=examples,
        deadline=None,
        phases=[Phase.explicit, Phase.reuse, Phase.generate, *([Phase.shrink] if shrink else [])],
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        print_blob=True,
    )


def _event(name: str) -> None:
    """Counted in hypothesis' statistics (`--hypothesis-show-statistics`): what the runs drew."""
    if currently_in_test_context():
        event(name)


class Killed(BaseException):
    """A run killed between the downstream's commit and the ledger record."""


@dataclass
class Feed:
    """An upstream and its incremental downstream (a per-group aggregate): the upstream's state
    per snapshot as the writes' semantics say (the oracle), and the downstream's position."""

    up: DatasetSpec
    down: DatasetSpec
    states: dict[int, State] = field(default_factory=dict)
    position: int | None = None  # the upstream snapshot the downstream consumed to
    expired_position: bool = False


class Model:
    """The upstream `orders` (keyed by `id`), the model node's output `scores` over it (keyed by
    the row index), and a downstream of each."""

    def __init__(
        self, runtime: Any, *, down_mode: Mode = "iceberg", up_mode: Mode = "iceberg"
    ) -> None:
        n = next(_names)
        self.runtime = runtime
        up = DatasetSpec(name=f"orders_{n}", primary_key=("id",), mode=up_mode)
        self.up = replace(up, allow_empty=True)
        down = DatasetSpec(
            name=f"totals_{n}", primary_key=("grp",), strategy="sync", mode=down_mode
        )
        self.orders = Feed(self.up, down)
        self.node = ModelSpec(
            name=f"scores_{n}",
            source=self.up,
            predict=lambda rows: rows.select("id", "grp", "amount"),
            mode="iceberg",
        )
        scored = DatasetSpec(name=f"score_totals_{n}", primary_key=("grp",), strategy="sync")
        self.scores = Feed(self.node.output, replace(scored, mode="iceberg"))
        events = DatasetSpec(name=f"events_{n}", strategy="append_always", allow_empty=True)
        counted = DatasetSpec(name=f"event_totals_{n}", primary_key=("grp",), strategy="sync")
        self.events = Feed(replace(events, mode="iceberg"), replace(counted, mode="iceberg"))
        self.event_rows: list[Row] = []
        self.rows: dict[int, Row] = {}
        self.names = dict(BASE)  # the upstream's schema now: field -> name
        self.extra: str | None = None  # the added column's field, while the table has it
        self.planned = False
        self.runs = 0

    # -- the upstream

    def _row(self, i: int, grp: str, amount: int, note: str | None = None) -> Row:
        row: Row = {"id": i, "grp": grp, "amount": amount}
        if self.extra is not None:
            row[self.extra] = note
        return row

    def _frame(self, rows: dict[int, Row]) -> pl.DataFrame:
        data: dict[str, Any] = {f: [r[f] for r in rows.values()] for f in BASE}
        schema: dict[str, Any] = {"id": pl.Int64, "grp": pl.String, "amount": pl.Int64}
        if self.extra is not None:
            name = self.names[self.extra]
            data[name] = [r.get(self.extra) for r in rows.values()]
            schema[name] = pl.String
        return pl.DataFrame(data, schema=schema)

    def _table(self, spec: DatasetSpec | None = None) -> Any:
        return self.runtime.iceberg.load(spec or self.up)

    def _head(self, spec: DatasetSpec | None = None) -> int | None:
        table = self._table(spec)
        return head(table) if table is not None else None

    def _remember(self, feed: Feed | None = None, rows: dict[int, Row] | None = None) -> None:
        """The state of the upstream's head, under the schema it was committed with (a write
        that committed nothing leaves its head's state as it was)."""
        feed = feed or self.orders
        now = self._head(feed.up)
        if now is not None and now not in feed.states:
            names = self.names if feed is self.orders else SCORED if feed is self.scores else BASE
            feed.states[now] = (dict(self.rows if rows is None else rows), dict(names))

    def write(
        self,
        kind: str,
        drawn: list[tuple[int, str, int]],
        group: str | None = None,
        strategy: str = "snapshot_replace",
    ) -> None:
        if (
            kind == "evolve" and self.extra is None
        ):  # a new column (the name may be a dropped one's)
            self.extra = f"x{next(_names)}"
            self.names[self.extra] = "note"
        note = "n" if kind == "evolve" else None
        batch = {i: self._row(i, g if group is None else group, a, note) for i, g, a in drawn}
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
            publisher.publish(replace(spec, strategy=strategy), frame, mode=mode, partition=part)  # type: ignore[arg-type]
        else:
            publisher.publish(spec, frame, mode=mode)
        if first or kind in ("replace", "sync"):
            self.rows = dict(batch)
        elif kind == "append_new":
            self.rows.update({i: r for i, r in batch.items() if i not in self.rows})
        elif kind == "slice":
            self.rows = {i: r for i, r in self.rows.items() if r["grp"] != group or i in batch}
            self.rows.update(batch)
        else:
            self.rows.update(batch)
        self._remember()

    def window(self, index: int, drawn: list[tuple[int, str, int]], restate: bool) -> None:
        """Window `index` of the grid applied by `apply_window` (a `sync` of the window: its rows
        become exactly the compute's), or restated (a replace of the window's rows)."""
        window, (low, high) = WINDOWS[index], GRID[index]
        if not self.planned:  # the dataset's sensor plans its windows: here the whole grid
            self.runtime.windows.plan(self.up.name, WINDOWS)
            self.planned = True
        batch = {i: self._row(i, g, a) for i, g, a in drawn if low < i <= high}
        spec = replace(self.up, strategy="sync", delta=Delta(source="raw", watermark="id"))
        publisher = self.runtime.publisher
        frame = self._frame(batch)
        outcome = apply_window(
            ApplyRequest(
                spec=spec,
                window=window,
                compute=lambda: frame,
                mode=publisher.resolve(self.up),
                run_id=f"window-{self.up.name}-{self.runs}",
                restate=restate,
            ),
            publisher=publisher,
            ledger=self.runtime.windows,
        )
        self.runs += 1
        _event(f"window {outcome.action}" + (" (restated)" if restate else ""))
        if outcome.action == "skipped":  # applied already: nothing written
            assert not restate
            return
        assert outcome.action == "applied", outcome.action
        self.rows = {i: r for i, r in self.rows.items() if not (low < i <= high)}
        self.rows.update(batch)
        self._remember()

    def schema(self, change: str) -> None:
        """Another writer renames or drops the added column (a schema change, no snapshot)."""
        table = self._table()
        if self.extra is None or table is None or self.names[self.extra] not in table.schema():
            return
        old = self.names[self.extra]
        with table.update_schema() as update:
            if change == "rename":
                new = f"memo{next(_names)}"
                update.rename_column(old, new)
            else:
                update.delete_column(old)
        if change == "rename":
            self.names[self.extra] = new
        else:
            del self.names[self.extra]
            self.extra = None

    def score(self, batch_rows: int) -> None:
        """The model node scores the upstream as it is: its output replaced in one snapshot
        (streamed, `replace_streaming`), a row per upstream row in key order."""
        if self._table() is None or not self.rows:
            return
        node = replace(self.node, batch_rows=batch_rows)
        publisher = self.runtime.publisher
        score(
            node,
            publisher=publisher,
            ledger=self.runtime.windows,
            mode=publisher.resolve(node.output),
        )
        rows = {
            n: {ROW_INDEX: n, **{f: self.rows[i][f] for f in BASE}}
            for n, i in enumerate(sorted(self.rows))
        }
        self._remember(self.scores, rows)

    def write_events(self, kind: str, drawn: list[tuple[int, str, int]]) -> None:
        """The unkeyed upstream: `drawn` appended as they are (duplicates too), or the table
        replaced by them."""
        rows = [{"id": i, "grp": g, "amount": a} for i, g, a in drawn]
        spec = self.events.up if kind == "append" else replace(self.events.up, strategy="replace")
        frame = pl.DataFrame(rows, schema={"id": pl.Int64, "grp": pl.String, "amount": pl.Int64})
        publisher = self.runtime.publisher
        publisher.publish(spec, frame, mode=publisher.resolve(spec))
        self.event_rows = [*self.event_rows, *rows] if kind == "append" else rows
        self._remember(self.events, dict(enumerate(self.event_rows)))

    def audit(self, drawn: list[tuple[int, str, int]], publish: bool) -> None:
        if self._head() is None:
            return
        batch = {i: self._row(i, g, a) for i, g, a in drawn}
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

    def compact(self, group: str | None) -> None:
        table = self._table()
        if table is None:
            return
        where = None if group is None else EqualTo("grp", group)
        done = self.runtime.iceberg.compact(self.up, min_input_files=2, where=where)
        _event(
            f"compaction: {'skipped' if done.skipped else 'nothing' if done.noop else 'rewrote'}"
        )
        self._remember()

    def rewrite(self) -> None:
        """Another writer rewrites the table with the rows it holds (an overwrite snapshot that
        carries none of the project's change records)."""
        table = self._table()
        if table is None or not self.rows:
            return
        table.overwrite(table.scan().to_arrow())
        self._remember()

    def expire(self, force: bool) -> None:
        feeds = [
            f for f in (self.orders, self.scores, self.events) if self._table(f.up) is not None
        ]
        if not feeds:
            return
        options = MaintenanceOptions(
            audits=False,
            compact=False,
            orphans=False,
            older_than=timedelta(0),
            force=force,
        )
        specs = [f.up for f in feeds]
        maintain(self.runtime.iceberg, specs, options=options, ledger=self.runtime.windows)
        for feed in feeds:
            table = self._table(feed.up)
            gone = feed.position is not None and table.snapshot_by_id(feed.position) is None
            if gone and not feed.expired_position:
                # kept unless forced — a killed first run's too (its range noted before reading)
                assert force, "expiry removed a snapshot not consumed past"
                feed.expired_position = True

    def rollback(self, back: int) -> None:
        table = self._table()
        if table is None:
            return
        history = [s.snapshot_id for s in ancestry(table, head(table))]
        if len(history) <= back:
            return
        target = history[back]
        if target not in self.orders.states:
            return
        rollback(
            self.runtime.publisher,
            self.up,
            to_snapshot=target,
            reason="model",
            windows=self.runtime.windows,
        )
        self.rows = dict(self.orders.states[target][0])

    # -- the downstreams

    def compute(self, changes: Changes) -> pl.DataFrame:
        assert changes.current is not None
        changed = changes.keys("grp")
        now = (
            changes.current.join(changed.lazy(), on="grp", how="semi")
            .group_by("grp")
            .agg(pl.col("amount").sum().alias("total"), pl.len().cast(pl.Int64).alias("n"))
        )
        return changes.with_deletions(now, "grp")

    def run(self, fail: str | None, which: str = "orders") -> None:
        feed = {"orders": self.orders, "scores": self.scores, "events": self.events}[which]
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
            spec=feed.down,
            upstream=feed.up,
            compute=compute,
            mode=publisher.resolve(feed.down),
            upstream_mode=publisher.resolve(feed.up),
            run_id=f"run-{self.runs}",
        )
        self.runs += 1
        now = self._head(feed.up)
        written = self._head(feed.down)
        # what `pipeline-output plan` shows: the changes this run consumes
        pending = pending_changes(
            feed.down,
            feed.up,
            publisher=publisher,
            ledger=self.runtime.ledger,
            upstream_mode=request.upstream_mode,
        )
        try:
            outcome = consume_changes(
                request,
                publisher=publisher,
                ledger=self.runtime.ledger,
                on_written=killed if fail == "kill" else None,
            )
        except (RuntimeError, Killed) as exc:
            assert fail is not None, exc
            _event(
                f"run {fail}" + (" after the commit" if self._head(feed.down) != written else "")
            )
            if seen and isinstance(exc, Killed) and self._head(feed.down) != written:
                # killed after its commit: the range rides in the downstream's snapshot (a
                # write that committed nothing recorded nothing: the next run reads it again)
                self._check(feed, seen[0], now)
                feed.position, feed.expired_position = now, False
            return
        if now is None or now == feed.position:
            assert outcome.action == "noop" and not seen
            return
        assert len(seen) == 1
        got = seen[0]
        assert pending is not None
        assert (pending.from_snapshot, pending.to_snapshot, pending.full_refresh) == (
            got.from_snapshot,
            got.to_snapshot,
            got.full_refresh,
        )
        assert dict(pending.counts) == dict(got.counts)
        self._check(feed, got, now)
        feed.position, feed.expired_position = now, False

    def _check(self, feed: Feed, changes: Changes, now: int | None) -> None:
        assert changes.to_snapshot == now
        refresh = feed.position is None or feed.expired_position
        assert changes.full_refresh == refresh, (changes.full_refresh, changes.reason)
        if feed.expired_position:
            _event("full refresh after an expiry")
            assert "expired" in changes.reason, changes.reason
        if not refresh:
            assert changes.from_snapshot == feed.position  # exactly once: no gap, no overlap
        assert now is not None
        new, names = feed.states[now]
        old = {} if refresh else feed.states[feed.position][0]  # type: ignore[index]
        # every row under the schema `to` was committed with: a renamed column under its name
        # then (before rows too), a dropped one absent, an added one null where it was not yet
        columns = [c for c in changes.frame.columns if not c.startswith("_change")]
        assert columns == list(names.values()), (columns, names)
        if feed.up.primary_key:
            assert _diff(changes.frame) == _expected(old, new, names)
        else:  # a multiset of whole rows: inserts and deletes, duplicates counted
            assert _multiset_diff(changes.frame) == _multiset_expected(old, new, names)
        # the downstream equals its full recompute from the upstream as of `to`
        stored = self.runtime.iceberg.read(feed.down).sort("grp")
        assert stored.select("grp", "total", "n").rows() == _aggregate(new)


def _diff(frame: pl.DataFrame) -> dict[str, set[tuple[Any, ...]]]:
    cols = [c for c in frame.columns if not c.startswith("_change")]
    out: dict[str, set[tuple[Any, ...]]] = {}
    for kind in ("insert", "delete", "update_before", "update_after"):
        part = frame.filter(pl.col(CHANGE_TYPE) == kind).select(cols)
        out[kind] = set(part.rows())
    return out


def _multiset_diff(frame: pl.DataFrame) -> dict[str, Counter[tuple[Any, ...]]]:
    cols = [c for c in frame.columns if not c.startswith("_change")]
    kinds = frame.get_column(CHANGE_TYPE).to_list()
    out: dict[str, Counter[tuple[Any, ...]]] = {k: Counter() for k in ("insert", "delete")}
    for kind, row in zip(kinds, frame.select(cols).rows(), strict=True):
        out[kind][row] += 1
    return out


def _multiset_expected(
    old: dict[int, Row], new: dict[int, Row], names: dict[str, str]
) -> dict[str, Counter[tuple[Any, ...]]]:
    before = Counter(tuple(r.get(f) for f in names) for r in old.values())
    after = Counter(tuple(r.get(f) for f in names) for r in new.values())
    return {"insert": after - before, "delete": before - after}


def _expected(
    old: dict[int, Row], new: dict[int, Row], names: dict[str, str]
) -> dict[str, set[tuple[Any, ...]]]:
    """The difference by key of two states, both under the `to` schema `names` (by field)."""

    def row(r: Row) -> tuple[Any, ...]:
        return tuple(r.get(f) for f in names)

    out: dict[str, set[tuple[Any, ...]]] = {k: set() for k in ("insert", "delete")}
    out["update_before"], out["update_after"] = set(), set()
    for i, r in new.items():
        if i not in old:
            out["insert"].add(row(r))
        elif row(old[i]) != row(r):
            out["update_before"].add(row(old[i]))
            out["update_after"].add(row(r))
    out["delete"] = {row(r) for i, r in old.items() if i not in new}
    return out


def _aggregate(rows: dict[int, Row]) -> list[tuple[str, int, int]]:
    totals: dict[str, tuple[int, int]] = {}
    for row in rows.values():
        grp, amount = row["grp"], row["amount"]
        total, n = totals.get(grp, (0, 0))
        totals[grp] = (total + amount, n + 1)
    return sorted((g, t, n) for g, (t, n) in totals.items())


def _apply(model: Model, op: tuple[Any, ...]) -> None:
    name = op[0]
    _event(name)
    if name == "slice":
        model.write("slice", op[2], group=op[1], strategy=op[3])
    elif name == "window":
        model.window(op[1], op[2], op[3])
    elif name == "schema":
        model.schema(op[1])
    elif name == "events":
        model.write_events(op[1], op[2])
    elif name == "score":
        model.score(op[1])
    elif name == "audit":
        model.audit(op[1], op[2])
    elif name == "compact":
        model.compact(op[1])
    elif name == "rewrite":
        model.rewrite()
    elif name == "expire":
        model.expire(op[1])
    elif name == "rollback":
        model.rollback(op[1])
    elif name == "run":
        model.run(op[1], op[2])
    else:
        model.write(name, op[1])


@pytest.fixture
def runtime(env: str) -> Any:
    from pipeline_output.dagster_layer.resource import get_runtime

    return get_runtime()


# every rule at least once, in an order where each does something (the drawn examples may not)
EVERY_RULE: list[tuple[Any, ...]] = [
    ("upsert_cow", [(1, "a", 1), (2, "b", 2), (3, "c", 1)]),
    ("events", "append", [(1, "a", 1), (1, "a", 1)]),
    ("run", None, "orders"),
    ("run", None, "events"),
    ("upsert_mor", [(1, "a", 2), (4, "a", 3)]),
    ("append", [(5, "b", 1)]),
    ("append_new", [(5, "c", 9), (6, "c", 2)]),
    ("evolve", [(2, "b", 2)]),
    ("run", "raise", "orders"),
    ("run", "kill", "orders"),
    ("schema", "rename"),
    ("sync", [(1, "a", 2), (2, "b", 3), (4, "a", 3), (6, "c", 2), (7, "b", 1)]),
    ("slice", "a", [(1, "a", 5)], "replace"),
    ("slice", "b", [(2, "b", 3), (7, "b", 0)], "snapshot_replace"),
    ("window", 1, [(2, "c", 1), (3, "c", 2)], False),
    ("window", 1, [(2, "c", 4)], False),  # applied already: skipped
    ("window", 1, [(3, "a", 1)], True),  # restated
    ("score", 2),
    ("run", None, "orders"),
    ("run", None, "scores"),
    ("compact", None),
    ("rewrite",),
    ("audit", [(1, "a", 7)], False),  # staged, never published: invisible
    ("audit", [(4, "c", 1)], True),
    ("schema", "drop"),
    ("events", "replace", [(1, "a", 1)]),
    ("run", None, "orders"),
    ("rollback", 1),
    ("upsert_cow", [(6, "c", 6)]),
    ("expire", False),  # keeps the position
    ("run", None, "orders"),
    ("upsert_cow", [(7, "a", 1)]),
    ("expire", True),  # removes it: the next run is a full refresh that says why
    ("evolve", [(3, "c", 3)]),  # `note` again: a new column
    ("run", None, "orders"),
    ("score", 3),
]


@_settings()
@example(ops=EVERY_RULE)
@given(ops=st.lists(op_st, min_size=3, max_size=14))
def test_every_run_consumes_the_oracle_changes_once_and_equals_its_recompute(
    runtime: Any, ops: list[tuple[Any, ...]]
) -> None:
    model = Model(runtime)
    for op in [*ops, *[("run", None, feed) for feed in ("orders", "scores", "events")]]:
        _apply(model, op)


@pytest.mark.slow
@settings(_settings(), max_examples=80)
@given(ops=st.lists(op_st, min_size=8, max_size=24))
def test_deep_every_run_consumes_the_oracle_changes_once(
    runtime: Any, ops: list[tuple[Any, ...]]
) -> None:
    """The same, longer sequences and more examples (`pytest -m slow`)."""
    model = Model(runtime)
    for op in [*ops, *[("run", None, feed) for feed in ("orders", "scores", "events")]]:
        _apply(model, op)


def test_a_forced_expiry_makes_the_next_run_a_full_refresh_that_says_why(runtime: Any) -> None:
    model = Model(runtime)
    model.write("upsert_cow", [(1, "a", 1), (2, "b", 2)])
    model.run(None)
    model.write("upsert_cow", [(1, "a", 3)])
    model.expire(force=False)  # kept: the downstream has not consumed past it
    assert not model.orders.expired_position
    model.write("upsert_cow", [(3, "c", 3)])
    model.expire(force=True)
    assert model.orders.expired_position
    model.run(None)  # checked: a full refresh, equal to the recompute
    last = runtime.ledger.consumed_log.last(model.orders.down.name, model.up.name)
    assert last.full_refresh


def test_a_direct_expire_snapshots_call_keeps_a_consumers_position_unless_forced(
    runtime: Any,
) -> None:
    """The public `expire_snapshots` (not only `maintain`) protects what a downstream reads next."""
    from pipeline_output.maintenance import expire_snapshots

    model = Model(runtime)
    model.write("upsert_cow", [(1, "a", 1), (2, "b", 2)])
    model.run(None)
    model.write("upsert_cow", [(1, "a", 3)])
    model.write("upsert_mor", [(3, "c", 3)])
    position = model.orders.position
    assert position is not None
    expire = {"older_than": timedelta(0), "ledger": runtime.windows}
    expire_snapshots(runtime.iceberg, model.up, **expire)
    assert model._table(model.up).snapshot_by_id(position) is not None
    runtime.iceberg.expire_snapshots(model.up, **expire)  # the store's method: the same
    assert model._table(model.up).snapshot_by_id(position) is not None
    model.run(None)  # checked against the oracle: reads on from its position
    model.write("upsert_cow", [(2, "b", 5)])
    position = model.orders.position
    model.write("upsert_cow", [(4, "a", 1)])
    expire_snapshots(runtime.iceberg, model.up, force=True, **expire)
    assert model._table(model.up).snapshot_by_id(position) is None
    model.orders.expired_position = True
    model.run(None)  # checked: a full refresh that says why
    last = runtime.ledger.consumed_log.last(model.orders.down.name, model.up.name)
    assert last.full_refresh


def test_an_expiry_keeps_the_position_a_killed_run_committed_before_the_ledger_record(
    runtime: Any,
) -> None:
    model = Model(runtime)
    model.write("upsert_cow", [(1, "a", 1), (2, "b", 2)])
    model.run(None)
    model.write("upsert_mor", [(1, "a", 3)])
    model.run("kill")  # its range is in the downstream's snapshot, not in the ledger yet
    model.write("upsert_cow", [(3, "c", 3)])
    model.expire(force=False)  # checked: kept, the ledger's position and the killed run's
    assert not model.orders.expired_position
    model.run(None)  # checked: reads on from the killed run's `to`, no full refresh
    last = runtime.ledger.consumed_log.last(model.orders.down.name, model.up.name)
    assert not last.full_refresh


def test_a_dual_downstream_deletes_and_upserts_the_changed_keys_on_both_arms(runtime: Any) -> None:
    model = Model(runtime, down_mode="dual")
    model.write("upsert_cow", [(1, "a", 1), (2, "b", 2), (3, "b", 1)])
    model.run(None)
    model.write("replace", [(1, "a", 5), (4, "c", 1)])  # b loses every row: deleted downstream
    model.run(None)
    legacy = runtime.postgres.read(model.orders.down).sort("grp")
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
