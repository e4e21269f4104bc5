"""The change feed: what changed in a native table between two of its snapshots.

Owns `read_changes`: the **net** change between the table as of `from_snapshot` (exclusive; None
is the empty table) and as of `to_snapshot` (inclusive; default the branch's head), as the rows of
the table under `to_snapshot`'s schema tagged with a change type (`CHANGE_TYPE`: insert, delete,
update_before, update_after), the `to` snapshot (`CHANGE_SNAPSHOT`) and its commit time
(`CHANGE_COMMIT_TIME`). A state difference, not the intermediate versions: any pair of snapshots
works, `to` need not descend from `from` (a rollback reads as the reverse change).

- Keyed (`primary_key`): per key, only at `to` → insert; only at `from` → delete; at both with a
  value that differs (`frame_rows.values_differ`, the project's one definition) → update_before
  (the `from` row) and update_after (the `to` row); equal → nothing.
- Unkeyed: the multiset difference of rows (duplicates counted).

Composed from change files first (`_composed`): when every snapshot from `from` to `to` recorded
its own change at write time (`commit.CHANGE_FILE`, `commit.CHANGE_ADDED`) or is a rewrite, only
those are read and netted per key; otherwise (module docs/concepts.md "The change feed" lists
when) the manifest diff below, which is always correct.

Cost follows the change, not the table. The two snapshots' live files are diffed from their
manifests (decoded by fastavro, `manifest_decoding`; a manifest in both lists is read once):

- data files live only at `from` give their live rows (at `from`) to the `from` side, data files
  live only at `to` give theirs (at `to`) to the `to` side;
- a data file live at both whose positional deletes differ gives the rows deleted in between:
  positions deleted at `to` but not at `from` to the `from` side, the reverse to the `to` side
  (only that file's rows at those positions are kept);
- every other row (files live at both with the same delete files) is unchanged and never read.

Both sides are then netted by key (or as multisets): a copy-on-write rewrite puts a file's
untouched rows on both sides, and they cancel. Files are read by polars' native Iceberg scan
(`native_scan`: field ids, so renamed columns match, added ones read as null, dropped ones are not
in `to`'s schema), planned here instead of by pyiceberg. A range made only of rewrite snapshots
(operation `replace`: compaction, whose rows are the same by definition) is empty without reading
a file. Equality delete files (the project never writes them) are refused (`ChangesUnsupported`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import polars as pl
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestEntry,
    ManifestEntryStatus,
)
from pyiceberg.table import FileScanTask, Table
from pyiceberg.table.delete_file_index import DeleteFileIndex
from pyiceberg.table.snapshots import Operation, Snapshot

from pipeline_output.errors import ChangesExpired, ChangesUnsupported
from pipeline_output.stores.iceberg.snapshot.commit import (
    ADDED_ARE_INSERTS,
    CHANGE_ADDED,
    CHANGE_COUNTS,
    CHANGE_FILE,
)
from pipeline_output.stores.iceberg.snapshot.commit import (
    CHANGE_TYPE as CHANGE_TYPE,  # "_change_type": the change file's column, the rows' too
)
from pipeline_output.stores.iceberg.snapshot.files import deleted_positions, referenced_path
from pipeline_output.stores.iceberg.table.manifest_decoding import (
    manifest_entries,
    manifest_files,
)
from pipeline_output.stores.iceberg.table.native_scan import (
    quiet,
    snapshot_schema,
    storage,
    target_schema,
    typed,
)
from pipeline_output.stores.iceberg.table.scan_planning import FixedTable
from pipeline_output.stores.iceberg.table.tables import ancestry, head
from pipeline_output.stores.iceberg.write.frame_rows import rows_differ

CHANGE_SNAPSHOT = "_change_snapshot_id"
CHANGE_COMMIT_TIME = "_change_commit_time"

INSERT = "insert"
DELETE = "delete"
UPDATE_BEFORE = "update_before"
UPDATE_AFTER = "update_after"
CHANGE_TYPES = (INSERT, DELETE, UPDATE_BEFORE, UPDATE_AFTER)

# a downstream snapshot's summary property (without `pipeline-output.`) + the upstream's name:
# the range of the upstream's changes it consumed, `<from>:<to>` (from empty: none), then `:full`
# for a full refresh (`services/incremental.py` writes it; expiry keeps what it names)
CONSUMED_PREFIX = "changes."

_POS = "__po_pos__"
_PATH = "__po_path__"
_AFTER = "__po_after__"
_NTH = "__po_nth__"
_ORDER = "__po_order__"
_ORDER_OF = {DELETE: 0, UPDATE_BEFORE: 1, UPDATE_AFTER: 2, INSERT: 3}


@dataclass(frozen=True)
class ChangeSet:
    """The net change of a table between two snapshots.

    `frame`: the table's columns (its schema as of `to_snapshot`; the asked ones, in their order,
    when `read_changes` was given `columns`) and the three change columns;
    `from_snapshot`: exclusive, None for the empty table (every live row an insert);
    `to_snapshot`: inclusive, None only when the table has no snapshot;
    `counts`: rows per change type (every type, zeros included)."""

    frame: pl.DataFrame
    from_snapshot: int | None
    to_snapshot: int | None
    counts: Mapping[str, int]


def read_changes(
    table: Table,
    *,
    from_snapshot: int | None,
    to_snapshot: int | None = None,
    primary_key: Sequence[str] = (),
    branch: str = "main",
    composed: bool | None = None,
    columns: Sequence[str] | None = None,
) -> ChangeSet:
    """The net change of `table` from `from_snapshot` (exclusive; None: from the empty table) to
    `to_snapshot` (inclusive; default: `branch`'s head). A snapshot no longer in the table's
    metadata (expired): `ChangesExpired`, naming the table and the snapshot. `composed` (tests,
    benchmarks): None composes the range's change files when it can, else diffs manifests; True
    only composes (`ChangesUnsupported` when it cannot); False only diffs. `columns`: only these
    of the table's columns in each change row (as delta-rs `load_cdf(columns=...)`); which rows
    are changes is still decided on every column — a projection of the change, read from the
    change file alone when one write recorded it."""
    name = ".".join(table.name())
    to_id = to_snapshot if to_snapshot is not None else head(table, branch)
    if to_id is None and table.metadata.snapshots:
        raise ChangesUnsupported(f"table {name!r} has no branch {branch!r}")
    start = _snapshot(table, from_snapshot, name=name)
    end = _snapshot(table, to_id, name=name)
    target = target_schema(snapshot_schema(table, to_id))
    pk = list(primary_key)
    missing = [c for c in pk if c not in target]
    if missing:
        raise ChangesUnsupported(
            f"table {name!r}: primary key column(s) {missing} are not in its schema "
            f"(columns: {list(target)})"
        )
    shown = target
    if columns is not None:
        unknown = [c for c in columns if c not in target]
        if unknown:
            raise ChangesUnsupported(
                f"table {name!r}: column(s) {unknown} asked of its changes are not in its schema "
                f"(columns: {list(target)})"
            )
        shown = pl.Schema({c: target[c] for c in columns})
    if end is None or from_snapshot == to_id or _only_rewrites(table, start, end):
        return _change_set(_empty(shown), shown, from_snapshot, end)
    if pk and composed is not False:
        found = _composed(table, start, end, target=target, pk=pk, shown=shown)
        if found is not None:
            rows, counts = found
            return _change_set(rows, shown, from_snapshot, end, counts=counts)
        if composed:
            raise ChangesUnsupported(f"table {name!r}: the range has no change files to compose")
    before, after = _sides(table, start, end, target=target)
    netted = _net_by_key(before, after, pk) if pk else _net_as_multisets(before, after)
    return _change_set(netted, shown, from_snapshot, end)


def consumed_range(value: str) -> tuple[int | None, int, bool]:
    """(from, to, full refresh) of a consumed-range summary value (`CONSUMED_PREFIX`)."""
    low, high, *rest = value.split(":")
    return (int(low) if low else None), int(high), rest == ["full"]


def _snapshot(table: Table, snapshot_id: int | None, *, name: str) -> Snapshot | None:
    if snapshot_id is None:
        return None
    found = table.snapshot_by_id(snapshot_id)
    if found is None:
        raise ChangesExpired(
            f"table {name!r}: snapshot {snapshot_id} is not in its metadata any more (expired, "
            "or never one of its snapshots); its changes since then cannot be read"
        )
    return found


def _composed(
    table: Table,
    start: Snapshot | None,
    end: Snapshot,
    *,
    target: pl.Schema,
    pk: list[str],
    shown: pl.Schema,
) -> tuple[pl.DataFrame, dict[str, int] | None] | None:
    """The net change from `start` to `end` composed from the change each snapshot on the way
    recorded at write time (`commit.CHANGE_FILE`, `commit.CHANGE_ADDED`), reading only those;
    rewrites (`replace`) change nothing. None when that is not possible: `end` does not descend
    from `start`, a snapshot on the way carries no change of its own (another writer, a replace
    write, a rollback's cherry-pick...), a schema differs from `end`'s, or a change file cannot be
    read, or `start` is None. Per key: the first change's before and the last change's after, netted as the manifest
    diff nets (`_net_by_key`). One write's change is net already: only the `shown` columns of its
    file are read, and its counts are the ones the write recorded (`CHANGE_COUNTS`; None: count
    them)."""
    if start is None:  # every live row: reading the live files is that already (and expiry
        return None  # may have dropped the first snapshots, leaving a root that is not one)
    path: list[Snapshot] = []
    for snap in ancestry(table, end.snapshot_id):
        if snap.snapshot_id == start.snapshot_id:
            break
        path.append(snap)
    else:
        return None  # `start` is not an ancestor of `end`
    parts: list[tuple[int, Snapshot]] = []
    for seq, snap in enumerate(reversed(path)):
        if snap.summary is None:
            return None
        if snap.summary.operation == Operation.REPLACE:
            continue  # a rewrite: the same rows
        if snap.schema_id != end.schema_id or not (
            snap.summary.get(CHANGE_FILE) or snap.summary.get(CHANGE_ADDED) == ADDED_ARE_INSERTS
        ):
            return None
        parts.append((seq, snap))
    if not parts:
        return _empty(target), None
    only = shown if len(parts) == 1 else target
    try:
        with quiet():
            recorded = [(seq, _recorded(table, snap, only)) for seq, snap in parts]
    except (OSError, pl.exceptions.PolarsError):
        return None  # a change file gone or unreadable: the manifest diff instead
    cols = list(target)
    if len(recorded) == 1:  # one write's change is net already (its merge compared the rows)
        return recorded[0][1], _recorded_counts(parts[0][1])
    events = pl.concat(
        [frame.with_columns(pl.lit(seq).alias(_ORDER)) for seq, frame in recorded],
        how="vertical_relaxed",
    )
    bounds = events.group_by(pk).agg(
        pl.col(_ORDER).min().alias("__po_first__"), pl.col(_ORDER).max().alias("__po_last__")
    )
    events = events.join(bounds, on=pk, how="inner", nulls_equal=True)
    kind = pl.col(CHANGE_TYPE)
    before = events.filter(
        kind.is_in([DELETE, UPDATE_BEFORE]) & (pl.col(_ORDER) == pl.col("__po_first__"))
    )
    after = events.filter(
        kind.is_in([INSERT, UPDATE_AFTER]) & (pl.col(_ORDER) == pl.col("__po_last__"))
    )
    return _net_by_key(before.select(cols), after.select(cols), pk), None


def _recorded_counts(snap: Snapshot) -> dict[str, int] | None:
    """The rows per change type `snap`'s write recorded with its change file (None: not
    recorded, or not as `commit.change_counts` writes them)."""
    value = snap.summary.get(CHANGE_COUNTS) if snap.summary is not None else None
    if not value or not snap.summary or not snap.summary.get(CHANGE_FILE):
        return None
    counts = dict.fromkeys(CHANGE_TYPES, 0)
    for item in value.split(","):
        kind, _, n = item.partition("=")
        if kind not in counts or not n.isdigit():
            return None
        counts[kind] = int(n)
    return counts


def _recorded(table: Table, snap: Snapshot, target: pl.Schema) -> pl.DataFrame:
    """The change `snap` recorded at write time, `target`'s columns of it: its change file, or its
    added files' rows."""
    change_file = snap.summary.get(CHANGE_FILE) if snap.summary is not None else None
    wanted = [*target, CHANGE_TYPE]
    if change_file:
        if change_file.startswith("file://"):  # polars' local reader: no object store to set up
            frame = pl.read_parquet(change_file.removeprefix("file://"), columns=wanted)
        else:
            frame = pl.read_parquet(
                change_file, columns=wanted, storage_options=storage(table) or None
            )
    else:
        frame = (
            _added(table, snap)
            .with_columns(pl.lit(INSERT).alias(CHANGE_TYPE))
            .select(wanted)
            .collect()
        )
    frame = typed(frame, target)
    return frame if frame.columns == wanted else frame.select(wanted)


def _added(table: Table, snapshot: Snapshot) -> pl.LazyFrame:
    """The rows of the data files `snapshot` added (its inserts, when it says so)."""
    sid = snapshot.snapshot_id
    tasks = [
        FileScanTask(entry.data_file)
        for manifest in manifest_files(table.io, snapshot)
        if manifest.added_snapshot_id == sid
        for entry in manifest_entries(table.io, manifest)
        if entry.status == ManifestEntryStatus.ADDED
        and entry.snapshot_id == sid
        and entry.data_file.content == DataFileContent.DATA
    ]
    if not tasks:
        return pl.LazyFrame(schema=target_schema(snapshot_schema(table, sid)))
    return _scan(table, tasks, sid)


def _only_rewrites(table: Table, start: Snapshot | None, end: Snapshot) -> bool:
    """Whether one snapshot descends from the other through rewrite (`replace`) snapshots only:
    the same rows at both ends, proven from the metadata alone."""
    if start is None:
        return False
    for newer, older in ((end, start), (start, end)):
        for snap in ancestry(table, newer.snapshot_id):
            if snap.snapshot_id == older.snapshot_id:
                return True
            if snap.summary is None or snap.summary.operation != Operation.REPLACE:
                break
    return False


@dataclass
class _Live:
    """A snapshot's live data files (path → manifest entry) and its delete files."""

    data: dict[str, ManifestEntry] = field(default_factory=dict)
    deletes: list[ManifestEntry] = field(default_factory=list)
    _index: DeleteFileIndex | None = None

    def delete_files(self, entry: ManifestEntry) -> set[DataFile]:
        """The delete files that apply to the data file of `entry` at this snapshot."""
        if self._index is None:
            self._index = DeleteFileIndex()
            for d in self.deletes:
                self._index.add_delete_file(d, partition_key=d.data_file.partition)
        return self._index.for_data_file(
            entry.sequence_number or 0, entry.data_file, partition_key=entry.data_file.partition
        )

    def task(self, entry: ManifestEntry) -> FileScanTask:
        return FileScanTask(entry.data_file, delete_files=self.delete_files(entry))


def _live(table: Table, snapshot: Snapshot | None, cache: dict[str, list[ManifestEntry]]) -> _Live:
    out = _Live()
    if snapshot is None:
        return out
    for manifest in manifest_files(table.io, snapshot):
        entries = cache.get(manifest.manifest_path)
        if entries is None:
            entries = cache[manifest.manifest_path] = manifest_entries(table.io, manifest)
        for entry in entries:
            content = entry.data_file.content
            if content == DataFileContent.DATA:
                out.data[entry.data_file.file_path] = entry
            elif content == DataFileContent.POSITION_DELETES:
                out.deletes.append(entry)
            else:
                raise ChangesUnsupported(
                    f"table {'.'.join(table.name())!r}: snapshot {snapshot.snapshot_id} carries "
                    f"an equality delete file ({entry.data_file.file_path}), which this project "
                    "never writes and its change feed does not read"
                )
    return out


def _sides(
    table: Table, start: Snapshot | None, end: Snapshot, *, target: pl.Schema
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The rows live at `start` only (`from` side) and at `end` only (`to` side) of the files
    that differ between them, under `target` (the `to` schema); unchanged files are not read."""
    cache: dict[str, list[ManifestEntry]] = {}
    old, new = _live(table, start, cache), _live(table, end, cache)
    before = [old.task(e) for p, e in old.data.items() if p not in new.data]
    after = [new.task(e) for p, e in new.data.items() if p not in old.data]
    old_deletes = {d.data_file.file_path for d in old.deletes}
    new_deletes = {d.data_file.file_path for d in new.deletes}
    changed = [d for d in old.deletes if d.data_file.file_path not in new_deletes] + [
        d for d in new.deletes if d.data_file.file_path not in old_deletes
    ]
    kept = _touched(changed, old.data.keys() & new.data.keys())
    pairs = [(old.task(old.data[p]), new.task(new.data[p])) for p in kept]
    pairs = [
        (o, n)
        for o, n in pairs
        if {d.file_path for d in o.delete_files} != {d.file_path for d in n.delete_files}
    ]
    gone_old = _deleted(table, [o for o, _ in pairs])
    gone_new = _deleted(table, [n for _, n in pairs])
    on = [_PATH, _POS]
    dropped = gone_new.join(gone_old, on=on, how="anti")  # live at `from`, deleted by `to`
    revived = gone_old.join(gone_new, on=on, how="anti")  # deleted at `from`, live at `to`
    bare = [FileScanTask(n.file) for _, n in pairs]
    return (
        _read(table, before, bare, dropped, to_id=end.snapshot_id, target=target),
        _read(table, after, bare, revived, to_id=end.snapshot_id, target=target),
    )


def _deleted(table: Table, tasks: list[FileScanTask]) -> pl.DataFrame:
    """(data file path, position) of every row the tasks' delete files delete: the file-scoped
    Parquet delete files this project writes read in one scan, any other kind (another engine's
    partition-scoped files, deletion vectors) file by file (`files.deleted_positions`)."""
    own: set[str] = set()
    parts = []
    for task in tasks:
        path = task.file.file_path
        for d in task.delete_files:
            if d.file_format == FileFormat.PARQUET and referenced_path(d) == path:
                own.add(d.file_path)
            else:
                pos = deleted_positions(table.io, task, files=[d])
                parts.append(pl.DataFrame({_PATH: [path] * len(pos), _POS: pos}))
    if own:
        read = pl.scan_parquet(sorted(own), storage_options=storage(table) or None)
        parts.append(
            read.select(pl.col("file_path").alias(_PATH), pl.col("pos").alias(_POS)).collect()
        )
    if not parts:
        return pl.DataFrame(schema={_PATH: pl.String, _POS: pl.Int64})
    return pl.concat([p.cast({_PATH: pl.String, _POS: pl.Int64}) for p in parts]).unique()


def _touched(changed: list[ManifestEntry], kept: Iterable[str]) -> list[str]:
    """The data files live at both ends that a delete file live at one end only may apply to."""
    kept = set(kept)
    if not changed:
        return []
    referenced = [referenced_path(d.data_file) for d in changed]
    if any(r is None for r in referenced):  # a delete file of another engine's: any file
        return sorted(kept)
    return sorted({r for r in referenced if r is not None} & kept)


def _read(
    table: Table,
    tasks: list[FileScanTask],
    bare: list[FileScanTask],
    positions: pl.DataFrame,
    *,
    to_id: int,
    target: pl.Schema,
) -> pl.DataFrame:
    """The live rows of `tasks` and the rows of the `bare` files (no delete applied) at
    `positions` (data file path, position), read under `target` (snapshot `to_id`'s schema) by
    polars' native scan: the `bare` files in one scan whose row index, less each file's offset
    (the physical rows of the files before it), is the position in the file."""
    frames: list[pl.LazyFrame] = []
    if tasks:
        frames.append(_scan(table, tasks, to_id))
    touched = set(positions.get_column(_PATH).unique()) if positions.height else set()
    bare = [t for t in bare if t.file.file_path in touched]
    if bare:
        starts, offset = [], 0
        for task in bare:
            starts.append(offset)
            offset += task.file.record_count
        offsets = pl.DataFrame({_PATH: [t.file.file_path for t in bare], "__start": starts})
        wanted = positions.join(offsets, on=_PATH).select(
            (pl.col(_POS) + pl.col("__start")).cast(pl.UInt64).alias(_POS)
        )
        frames.append(
            _scan(table, bare, to_id)
            .with_row_index(_POS)
            .with_columns(pl.col(_POS).cast(pl.UInt64))
            .join(wanted.lazy(), on=_POS, how="semi")
            .drop(_POS)
        )
    if not frames:
        return _empty(target)
    with quiet():
        read = pl.concat(frames, how="vertical_relaxed").collect()
    return typed(read.select([c for c in target if c in read.columns]), target)


def _scan(table: Table, tasks: list[FileScanTask], snapshot_id: int | None) -> pl.LazyFrame:
    return pl.scan_iceberg(
        FixedTable.of(table, tuple(tasks)),
        snapshot_id=snapshot_id,
        storage_options=storage(table),
    )


def _net_by_key(before: pl.DataFrame, after: pl.DataFrame, pk: list[str]) -> pl.DataFrame:
    """Per key: deleted, inserted, or updated (before and after rows) when a value differs. One
    full join of the two sides (a copy-on-write rewrite's untouched rows meet and drop out)."""
    cols = before.columns
    values = [c for c in cols if c not in pk]
    left, right = "__po_left__", "__po_right__"
    joined = before.with_columns(pl.lit(True).alias(left)).join(
        after.select(*[pl.col(c).alias(_AFTER + c) for c in cols], pl.lit(True).alias(right)),
        left_on=pk,
        right_on=[_AFTER + c for c in pk],
        how="full",
        nulls_equal=True,
    )
    at_from, at_to = pl.col(left).is_not_null(), pl.col(right).is_not_null()
    joined = joined.filter(~at_from | ~at_to | rows_differ(values, new_prefix=_AFTER))
    old = joined.select(*cols, at_from.alias(left), at_to.alias(right))
    new = joined.select(
        *[pl.col(_AFTER + c).alias(c) for c in cols], at_from.alias(left), at_to.alias(right)
    )
    kind = pl.col(left) & pl.col(right)
    return (
        pl.concat(
            [
                old.filter(pl.col(left)).with_columns(
                    pl.when(kind)
                    .then(pl.lit(UPDATE_BEFORE))
                    .otherwise(pl.lit(DELETE))
                    .alias(CHANGE_TYPE)
                ),
                new.filter(pl.col(right)).with_columns(
                    pl.when(kind)
                    .then(pl.lit(UPDATE_AFTER))
                    .otherwise(pl.lit(INSERT))
                    .alias(CHANGE_TYPE)
                ),
            ]
        )
        .drop(left, right)
        .sort([*pk, pl.col(CHANGE_TYPE).replace_strict(_ORDER_OF, return_dtype=pl.Int8)])
    )


def _net_as_multisets(before: pl.DataFrame, after: pl.DataFrame) -> pl.DataFrame:
    """Rows at `to` not matched at `from` (inserts) and the reverse (deletes), counting copies."""
    cols = before.columns

    def numbered(frame: pl.DataFrame) -> pl.DataFrame:
        if not cols:
            return frame
        return frame.with_columns(pl.int_range(pl.len()).over(cols).alias(_NTH))

    b, a = numbered(before), numbered(after)
    on = [*cols, _NTH]
    deleted = b.join(a, on=on, how="anti", nulls_equal=True).select(cols)
    inserted = a.join(b, on=on, how="anti", nulls_equal=True).select(cols)
    return pl.concat(
        [
            deleted.with_columns(pl.lit(DELETE).alias(CHANGE_TYPE)),
            inserted.with_columns(pl.lit(INSERT).alias(CHANGE_TYPE)),
        ]
    )


def _empty(target: pl.Schema) -> pl.DataFrame:
    return pl.DataFrame(schema=target)


def _change_set(
    rows: pl.DataFrame,
    target: pl.Schema,
    from_snapshot: int | None,
    end: Snapshot | None,
    *,
    counts: dict[str, int] | None = None,
) -> ChangeSet:
    if CHANGE_TYPE not in rows.columns:
        rows = rows.with_columns(pl.lit(None, dtype=pl.String).alias(CHANGE_TYPE))
    # the commit time as microseconds cast in polars: a Python datetime literal costs a Series
    # conversion (~10 ms on a process's first call)
    committed = end.timestamp_ms * 1000 if end is not None else None
    frame = rows.select(
        *target,
        pl.col(CHANGE_TYPE).cast(pl.String),
        pl.lit(end.snapshot_id if end is not None else None, dtype=pl.Int64).alias(CHANGE_SNAPSHOT),
        pl.lit(committed, dtype=pl.Int64).cast(pl.Datetime("us", "UTC")).alias(CHANGE_COMMIT_TIME),
    )
    if counts is None or sum(counts.values()) != frame.height:
        kind = pl.col(CHANGE_TYPE)
        found = frame.select([(kind == k).sum().alias(k) for k in CHANGE_TYPES]).row(0, named=True)
        counts = {k: int(found[k] or 0) for k in CHANGE_TYPES}
    return ChangeSet(
        frame=frame,
        from_snapshot=from_snapshot,
        to_snapshot=end.snapshot_id if end is not None else None,
        counts=counts,
    )
