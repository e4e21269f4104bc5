"""Copy-on-write or merge-on-read: the choice a merge makes for each data file it changes.

Copy-on-write rewrites the file without the replaced/deleted rows (reads stay as fast as on a fresh
table; the write costs the whole file). Merge-on-read keeps the file, writes the replaced rows'
new versions as new data and the removed rows' positions as a positional delete file (the write
costs the changed rows; every reader then filters the file by its deletes). The choice, in order:

1. the dataset's `write_strategy_hint` (`copy-on-write` / `merge-on-read`), when not `auto`;
2. the table's own Iceberg property, as other engines read it: `write.merge.mode` for upsert and
   sync, `write.delete.mode` for a windowed replace (values `copy-on-write` / `merge-on-read`);
3. `auto`, by cost. A write whose changed files total at most `COW_BUDGET_PROPERTY` bytes
   (default 16 MiB) rewrites them all — the table keeps reading like a fresh one, with no delete
   file to apply — unless that rewrite would cost more than `COW_WEIGHT` (2) times keeping them:
   keeping a file costs its changed rows' bytes (their new versions) plus `FIXED_BYTES` (a delete
   file and its manifest entries, in bytes of rewriting), so an upsert changing 2 % of each of
   twenty 1 MB files keeps them (rewriting 20 MB to change 0.4 MB would be the slower path by far)
   while one changing a tenth of a small file rewrites it. Above the budget — an upsert whose keys are spread over
   many files — each file is merged on read when it holds at least `MIN_ROWS` rows and, with this
   write's deletes, at most `MAX_DELETED_SHARE` of its rows are deleted; otherwise it is rewritten,
   which also folds the deletes it already carries, so a file never degrades past that share.

A file none of whose rows would stay live is dropped whatever the mode. Format-version 1 tables
cannot carry delete files: they are always copy-on-write, and an explicit merge-on-read hint on one
is refused before any I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyiceberg.table.metadata import TableMetadata

from pipeline_output.contract.spec import DatasetSpec, WriteStrategyHint
from pipeline_output.errors import UnsupportedWrite

MODE_PROPERTY = {
    "upsert": "write.merge.mode",
    "sync": "write.merge.mode",
    "replace": "write.delete.mode",
}
MIN_ROWS = 10_000  # smaller files cost less to rewrite than to carry deletes for
MAX_DELETED_SHARE = 0.2  # past this share of deleted rows a file is rewritten (deletes folded)
# a write whose changed files total at most this many bytes rewrites them (auto mode)
COW_BUDGET_PROPERTY = "pipeline-output.merge.copy-on-write-max-bytes"
COW_BUDGET_BYTES = 16 * 1024 * 1024  # ~1.5M rows of six columns (zstd)
# auto rewrites under the budget only while that costs at most COW_WEIGHT x keeping the files
COW_WEIGHT = 2.0
FIXED_BYTES = 256 * 1024  # keeping one file (a delete file, manifest entries) in rewritten bytes


@dataclass(frozen=True)
class MergePolicy:
    """The resolved mode of one write, and the per-file decision."""

    mode: WriteStrategyHint
    source: str  # where the mode came from, for metadata and errors
    cow_budget_bytes: int = COW_BUDGET_BYTES

    @classmethod
    def resolve(cls, spec: DatasetSpec, metadata: TableMetadata, write_mode: str) -> MergePolicy:
        """The policy of a `write_mode` write of `spec` into a table with `metadata`."""
        mode: WriteStrategyHint = "auto"
        source = "auto"
        prop = MODE_PROPERTY.get(write_mode)
        table_value = metadata.properties.get(prop) if prop else None
        if spec.write_strategy_hint != "auto":
            mode, source = spec.write_strategy_hint, "write_strategy_hint"
        elif table_value in ("copy-on-write", "merge-on-read"):
            mode, source = table_value, f"table property {prop}"  # type: ignore[assignment]
        if metadata.format_version < 2:
            if mode == "merge-on-read":
                raise UnsupportedWrite(
                    f"dataset {spec.name!r}: {source} asks for merge-on-read, but the table is "
                    "Iceberg format version 1, which has no delete files; upgrade the table "
                    "(format-version 2) or use copy-on-write (nothing was written)"
                )
            return cls(mode="copy-on-write", source="format version 1")
        raw_budget = metadata.properties.get(COW_BUDGET_PROPERTY)
        try:
            budget = int(raw_budget) if raw_budget is not None else COW_BUDGET_BYTES
        except ValueError as exc:
            raise UnsupportedWrite(
                f"dataset {spec.name!r}: table property {COW_BUDGET_PROPERTY}={raw_budget!r} is "
                "not a whole number of bytes (nothing was written)"
            ) from exc
        return cls(mode=mode, source=source, cow_budget_bytes=budget)

    def within_budget(self, changed_bytes: int, *, keep_bytes: int | None = None) -> MergePolicy:
        """The policy for a write whose changed files total `changed_bytes`: `auto` under the
        budget rewrites them all — unless `keep_bytes` (what keeping them costs: their changed
        rows' bytes plus `FIXED_BYTES` per file, when known) is less than `changed_bytes` /
        `COW_WEIGHT`."""
        if self.mode != "auto" or changed_bytes > self.cow_budget_bytes:
            return self
        if keep_bytes is not None and changed_bytes > COW_WEIGHT * keep_bytes:
            return MergePolicy(
                mode="auto",
                source="auto, cheaper to keep",
                cow_budget_bytes=self.cow_budget_bytes,
            )
        return MergePolicy(mode="copy-on-write", source="auto, under the budget")

    def merge_on_read(self, *, file_rows: int, deleted_before: int, deleting: int) -> bool:
        """Whether to keep a file of `file_rows` rows (`deleted_before` of them already deleted)
        and delete `deleting` more of its rows by position, rather than rewrite it."""
        if deleting <= 0 or deleted_before + deleting >= file_rows:
            return False  # nothing to delete, or nothing would stay live: drop or keep the file
        if self.mode != "auto":
            return self.mode == "merge-on-read"
        return file_rows >= MIN_ROWS and deleted_before + deleting <= MAX_DELETED_SHARE * file_rows
