"""Snapshot expiry between time-travel reads, for the model-based suite (`test_reliability_model`):
a mixin of hypothesis rules over the state machine's datasets (issue 30, items 1 and 6).

The model keeps, per dataset, what the table cannot be trusted to keep once expiry runs: every
entry main's snapshot log ever had (merged after every step, so each is seen before an expiry can
remove it), every version the model held and a time inside its stay as main, and the snapshots
expiry removed. Rules:

- `expire_snapshots_between_reads`: our expiry with `older_than` now or a recorded version's time,
  `retain_last` 1..3, and optionally another tool's tag on an older version first (the tag keeps
  it);
- `read_a_version_as_of_its_time_or_id`: `read(as_of=<recorded time>)` equals the model's version
  then, or is refused with `SnapshotExpired` — exactly when the time lies before the first log
  entry after the last entry of an expired snapshot (the documented rule: never another version,
  and no refusal beyond it); `read(as_of=<snapshot id>)` equals the version while the table has
  the snapshot, else is refused (`InvalidArgument`);
- `pin_a_lazy_read` / `collect_a_pinned_read`: a LazyFrame pinned to the current snapshot,
  collected later, equals that version, or — only once expiry removed the snapshot — fails with
  `SnapshotExpired` naming the dataset and the snapshot (never a raw `FileNotFoundError`).

Figures: `travel_figures()`, added to the suite's report.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import polars as pl
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule

from pipeline_output.errors import InvalidArgument, SnapshotExpired
from pipeline_output.services.reads import scan_iceberg_dataset
from pipeline_output_tests.oracle import assert_same_multiset

_tags = itertools.count()


@dataclass(frozen=True)
class Version:
    """A version main pointed at: its snapshot, a time inside its stay, the model's rows then."""

    snapshot_id: int
    at: datetime
    rows: pl.DataFrame


@dataclass
class Travel:
    """One dataset's history as the model knows it (module docstring)."""

    log: list[tuple[int, int]] = field(default_factory=list)  # (ms, snapshot id), every entry
    seen: set[tuple[int, int]] = field(default_factory=set)
    versions: list[Version] = field(default_factory=list)
    expired: set[int] = field(default_factory=set)
    pinned: list[tuple[pl.LazyFrame, Version]] = field(default_factory=list)

    def answerable_from(self) -> int | None:
        """The model's earliest answerable time: the entry after the last expired one."""
        last = max((i for i, (_, sid) in enumerate(self.log) if sid in self.expired), default=None)
        return None if last is None else self.log[last + 1][0]


_FIGURES: dict[str, int] = {}


def _count(key: str, n: int = 1) -> None:
    _FIGURES[key] = _FIGURES.get(key, 0) + n


def travel_figures() -> dict[str, int]:
    """The figures of these rules since the last call, for the suite's report (then reset)."""
    keys = (
        "expiries",
        "snapshots_expired",
        "tags_by_another_tool",
        "as_of_time_answered",
        "as_of_time_refused",
        "as_of_id_answered",
        "as_of_id_refused",
        "pinned_answered",
        "pinned_refused",
    )
    figures = {k: _FIGURES.get(k, 0) for k in keys}
    _FIGURES.clear()
    return figures


def _millis(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


class TimeTravelRules:
    """Expiry and time-travel rules over `self.arms` / `self.datasets` of the machine."""

    arms: Any
    datasets: list[Any]

    def _travel(self, ds: Any) -> Travel:
        book: dict[str, Travel] = self.__dict__.setdefault("_travel_book", {})
        return book.setdefault(ds.spec.name, Travel())

    @invariant()
    def record_versions_and_log(self) -> None:
        """After every step: main's new log entries, and a version when main's head moved."""
        for ds in self.datasets:
            if ds.table is None:
                continue
            table = self.arms.iceberg.load(ds.spec)
            travel = self._travel(ds)
            for entry in table.metadata.snapshot_log:
                key = (entry.timestamp_ms, entry.snapshot_id)
                if key not in travel.seen:
                    travel.seen.add(key)
                    travel.log.append(key)
            head = table.metadata.current_snapshot_id
            if head is not None and (
                not travel.versions or travel.versions[-1].snapshot_id != head
            ):
                travel.versions.append(Version(head, datetime.now(UTC), ds.table))
                time.sleep(0.002)  # the next commit's log entry lands in a later millisecond

    @precondition(lambda self: any(d.table is not None for d in self.datasets))
    @rule(
        which=st.integers(0, 1),
        retain=st.integers(1, 3),
        tag_back=st.one_of(st.none(), st.integers(1, 6)),
        cut=st.one_of(st.none(), st.integers(0, 10**6)),
    )
    def expire_snapshots_between_reads(
        self, which: int, retain: int, tag_back: int | None, cut: int | None
    ) -> None:
        ds = self.datasets[which % len(self.datasets)]
        travel = self._travel(ds)
        if ds.table is None or not travel.versions:
            return
        table = self.arms.iceberg.load(ds.spec)
        if tag_back is not None:  # another tool tags an older version: expiry must keep it
            older = [v for v in travel.versions[:-1] if table.snapshot_by_id(v.snapshot_id)]
            if older:
                chosen = older[-min(tag_back, len(older))]
                table.manage_snapshots().create_tag(chosen.snapshot_id, f"t{next(_tags)}").commit()
                _count("tags_by_another_tool")
        older_than: datetime | timedelta = timedelta(0)
        if cut is not None:
            older_than = travel.versions[cut % len(travel.versions)].at
        before = {s.snapshot_id for s in self.arms.iceberg.load(ds.spec).snapshots()}
        result = self.arms.iceberg.expire_snapshots(
            ds.spec, older_than=older_than, retain_last=retain, ledger=None
        )
        after = {s.snapshot_id for s in self.arms.iceberg.load(ds.spec).snapshots()}
        assert result.snapshots_expired == len(before - after)
        travel.expired |= before - after
        _count("expiries")
        _count("snapshots_expired", len(before - after))

    @precondition(lambda self: any(d.table is not None for d in self.datasets))
    @rule(which=st.integers(0, 1), pick=st.integers(0, 10**6), by_id=st.booleans())
    def read_a_version_as_of_its_time_or_id(self, which: int, pick: int, by_id: bool) -> None:
        ds = self.datasets[which % len(self.datasets)]
        travel = self._travel(ds)
        if not travel.versions:
            return
        version = travel.versions[pick % len(travel.versions)]
        reader = self.arms.reader
        if by_id:
            if version.snapshot_id in travel.expired:
                with pytest.raises(InvalidArgument, match=f"no snapshot {version.snapshot_id}"):
                    reader.read(ds.spec, as_of=version.snapshot_id)
                _count("as_of_id_refused")
                return
            assert_same_multiset(reader.read(ds.spec, as_of=version.snapshot_id), version.rows)
            _count("as_of_id_answered")
            return
        boundary = travel.answerable_from()
        if boundary is not None and _millis(version.at) < boundary:
            with pytest.raises(SnapshotExpired, match=f"dataset '{ds.spec.name}'") as refused:
                reader.read(ds.spec, as_of=version.at)
            assert "earliest time that can be answered" in str(refused.value)
            _count("as_of_time_refused")
            return
        got = reader.read(ds.spec, as_of=version.at)  # never another version, never refused
        assert_same_multiset(got, version.rows)
        _count("as_of_time_answered")

    @precondition(lambda self: any(d.table is not None for d in self.datasets))
    @rule(which=st.integers(0, 1))
    def pin_a_lazy_read(self, which: int) -> None:
        ds = self.datasets[which % len(self.datasets)]
        travel = self._travel(ds)
        if not travel.versions or len(travel.pinned) >= 4:
            return
        frame = scan_iceberg_dataset(self.arms.reader, ds.spec)
        travel.pinned.append((frame, travel.versions[-1]))

    @precondition(lambda self: any(self._travel(d).pinned for d in self.datasets))
    @rule(which=st.integers(0, 1), pick=st.integers(0, 3))
    def collect_a_pinned_read(self, which: int, pick: int) -> None:
        ds = self.datasets[which % len(self.datasets)]
        travel = self._travel(ds)
        if not travel.pinned:
            return
        frame, version = travel.pinned.pop(pick % len(travel.pinned))
        try:
            got = frame.collect()
        except SnapshotExpired as exc:
            assert version.snapshot_id in travel.expired, f"refused a live snapshot: {exc}"
            assert f"dataset '{ds.spec.name}'" in str(exc)
            assert f"snapshot {version.snapshot_id}" in str(exc)
            _count("pinned_refused")
            return
        assert_same_multiset(got, version.rows)  # read files may survive expiry: still exact
        _count("pinned_answered")
