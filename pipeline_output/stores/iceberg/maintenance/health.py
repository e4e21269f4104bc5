"""A table's health: how many files a read plans over, how much history it carries, and when it
was last maintained — and the thresholds past which that deserves a warning.

Owns `TableHealth` (measured from the current snapshot's manifests and the metadata files, no
data read), `HealthThresholds` and `FileCounts` (the cheap numbers every write reports, from the
snapshot summary and table properties only).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyiceberg.manifest import DataFileContent
from pyiceberg.table import Table

from pipeline_output.stores.iceberg.maintenance.compaction import LAST_COMPACTION
from pipeline_output.stores.iceberg.maintenance.compaction_plan import SMALL_FRACTION
from pipeline_output.stores.iceberg.maintenance.expiry import LAST_EXPIRY
from pipeline_output.stores.iceberg.snapshot.files import DEFAULT_TARGET_BYTES
from pipeline_output.stores.iceberg.snapshot.manifests import read_index

MIB = 1024 * 1024


@dataclass(frozen=True)
class HealthThresholds:
    """Past these a table is reported unhealthy (a warning, not an error)."""

    max_small_files: int = 32  # ... and more than max_small_file_ratio of all data files
    max_small_file_ratio: float = 0.5
    max_delete_files: int = 32
    max_snapshots: int = 500
    max_metadata_bytes: int = 16 * MIB  # metadata.json + manifest list + manifests


@dataclass(frozen=True)
class TableHealth:
    """What maintenance changes, measured on the table's current state."""

    table: str
    records: int
    data_files: int
    small_files: int  # data files below the small-file size (75 % of the target file size)
    delete_files: int
    data_bytes: int
    snapshots: int
    manifests: int
    metadata_json_bytes: int
    manifest_bytes: int  # the current snapshot's manifest list and manifests
    small_file_bytes: int
    last_compaction: str | None
    last_expiry: str | None

    @property
    def small_file_ratio(self) -> float:
        return self.small_files / self.data_files if self.data_files else 0.0

    @property
    def metadata_bytes(self) -> int:
        """What a reader reads before any data: metadata.json, manifest list, manifests."""
        return self.metadata_json_bytes + self.manifest_bytes

    @property
    def last_maintenance(self) -> str | None:
        """The later of the last compaction and the last expiry (their text starts with the
        UTC time, so they order as strings)."""
        done = [x for x in (self.last_compaction, self.last_expiry) if x]
        return max(done) if done else None

    def warnings(self, thresholds: HealthThresholds, *, metadata_bytes: bool = True) -> list[str]:
        """One line per threshold the table is past (empty: healthy); without `metadata_bytes`,
        of the file and snapshot thresholds only (what the maintenance sensor acts on)."""
        t, out = thresholds, []
        if self.small_files > t.max_small_files and self.small_file_ratio > t.max_small_file_ratio:
            out.append(
                f"{self.small_files} small data files of {self.data_files} "
                f"({self.small_file_ratio:.0%}, over {t.max_small_files}): run compaction"
            )
        if self.delete_files > t.max_delete_files:
            out.append(
                f"{self.delete_files} delete files (over {t.max_delete_files}): run compaction"
            )
        if self.snapshots > t.max_snapshots:
            out.append(f"{self.snapshots} snapshots (over {t.max_snapshots}): run snapshot expiry")
        if metadata_bytes and self.metadata_bytes > t.max_metadata_bytes:
            out.append(
                f"{self.metadata_bytes} metadata bytes (over {t.max_metadata_bytes}): run "
                "compaction and snapshot expiry"
            )
        return out

    def as_dict(self) -> dict[str, int | float | str]:
        """Plain values, for materialisation metadata, check results and the CLI."""
        return {
            "data_files": self.data_files,
            "small_files": self.small_files,
            "small_file_ratio": round(self.small_file_ratio, 4),
            "delete_files": self.delete_files,
            "records": self.records,
            "data_bytes": self.data_bytes,
            "snapshots": self.snapshots,
            "manifests": self.manifests,
            "metadata_bytes": self.metadata_bytes,
            "last_compaction": self.last_compaction or "never",
            "last_expiry": self.last_expiry or "never",
        }


def table_health(table: Table) -> TableHealth:
    """Measure `table` (reads the current manifests and the sizes of the metadata files)."""
    props = table.metadata.properties
    target = int(props.get("write.target-file-size-bytes", DEFAULT_TARGET_BYTES))
    small = int(target * SMALL_FRACTION)
    index = read_index(table)
    index.live.load(index.manifests)
    data = [
        e.data_file
        for entries in index.live.values()
        for e in entries
        if e.data_file.content == DataFileContent.DATA
    ]
    deletes = sum(1 for es in index.live.values() for e in es) - len(data)
    snapshot = table.current_snapshot()
    manifest_bytes = sum(m.manifest_length for m in index.manifests)
    if snapshot is not None:
        manifest_bytes += _size(table, snapshot.manifest_list)
    return TableHealth(
        table=".".join(table.name()),
        records=sum(f.record_count for f in data),
        data_files=len(data),
        small_files=sum(1 for f in data if f.file_size_in_bytes < small),
        delete_files=deletes,
        data_bytes=sum(f.file_size_in_bytes for f in data),
        snapshots=len(table.metadata.snapshots),
        manifests=len(index.manifests),
        metadata_json_bytes=_size(table, table.metadata_location),
        manifest_bytes=manifest_bytes,
        small_file_bytes=small,
        last_compaction=props.get(LAST_COMPACTION),
        last_expiry=props.get(LAST_EXPIRY),
    )


def _size(table: Table, location: str) -> int:
    try:
        return len(table.io.new_input(location))
    except (OSError, ValueError):
        return 0


@dataclass(frozen=True)
class FileCounts:
    """The cheap numbers: from the current snapshot's summary and the table properties."""

    data_files: int
    delete_files: int
    snapshots: int
    last_maintenance: str | None


def file_counts(table: Table) -> FileCounts:
    """File counts and last maintenance without reading any manifest."""
    snap = table.current_snapshot()
    summary = snap.summary if snap is not None and snap.summary is not None else None

    def total(key: str) -> int:
        raw = summary.get(key) if summary is not None else None
        return int(raw) if raw else 0

    props = table.metadata.properties
    done = [x for x in (props.get(LAST_COMPACTION), props.get(LAST_EXPIRY)) if x]
    return FileCounts(
        data_files=total("total-data-files"),
        delete_files=total("total-delete-files"),
        snapshots=len(table.metadata.snapshots),
        last_maintenance=max(done) if done else None,
    )
