"""Test helper: merge-on-read deletes as another engine (or issue 13) writes them.

`delete_positions(table, {data file path: [row positions]})` writes one Iceberg v2 positional
delete file per data file (Parquet, columns `file_path` / `pos` with the spec's reserved field
ids) and commits them in one snapshot, in a `deletes` manifest — what Spark's merge-on-read
delete leaves. Unlike the store's own merge-on-read writes (one file-scoped delete file per data
file), `scoped=False` writes one delete file for several data files, as other engines may.
"""

from __future__ import annotations

import io
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.table import Table

from pipeline_output.stores.iceberg.snapshot.commit import IndexedOverwrite
from pipeline_output.stores.iceberg.snapshot.manifests import FlatTransaction, read_index

FILE_PATH_ID = 2147483546
POS_ID = 2147483545
_SCHEMA = pa.schema(
    [
        pa.field(
            "file_path",
            pa.string(),
            nullable=False,
            metadata={"PARQUET:field_id": str(FILE_PATH_ID)},
        ),
        pa.field("pos", pa.int64(), nullable=False, metadata={"PARQUET:field_id": str(POS_ID)}),
    ]
)


def _long(value: int) -> bytes:
    return value.to_bytes(8, "little", signed=True)


def delete_positions(
    table: Table, positions: dict[str, list[int]], *, scoped: bool = True
) -> list[DataFile]:
    """Commit positional deletes for `positions` (data file path -> row positions); one delete
    file per data file, or (`scoped=False`) one delete file for all of them (its path bounds then
    span them). Returns them."""
    live = {t.file.file_path: t.file for t in read_index(table).tasks()}
    groups = [{p: v} for p, v in positions.items()] if scoped else [positions]
    deletes = []
    for group in groups:
        paths = sorted(group)
        rows = [(p, pos) for p in paths for pos in sorted(group[p])]
        arrow = pa.table(
            {"file_path": [r[0] for r in rows], "pos": [r[1] for r in rows]}, schema=_SCHEMA
        )
        buffer = io.BytesIO()
        pq.write_table(arrow, buffer)
        data = buffer.getvalue()
        location = f"{table.location().rstrip('/')}/data/deletes-{uuid.uuid4()}.parquet"
        with table.io.new_output(location).create() as out:
            out.write(data)
        target = live[paths[0]]
        delete_file = DataFile.from_args(
            content=DataFileContent.POSITION_DELETES,
            file_path=location,
            file_format=FileFormat.PARQUET,
            partition=target.partition,
            record_count=len(rows),
            file_size_in_bytes=len(data),
            sort_order_id=None,
            equality_ids=None,
            key_metadata=None,
            # bounds on file_path scope the delete file to its data files (as Spark writes them)
            lower_bounds={FILE_PATH_ID: paths[0].encode(), POS_ID: _long(rows[0][1])},
            upper_bounds={FILE_PATH_ID: paths[-1].encode(), POS_ID: _long(rows[-1][1])},
        )
        delete_file.spec_id = target.spec_id  # not a manifest field: set apart
        deletes.append(delete_file)
    tx = FlatTransaction(table)
    producer = IndexedOverwrite(tx, table.io, index=read_index(table), snapshot_properties={})
    for delete_file in deletes:  # added delete files go to a `deletes` manifest
        producer.append_data_file(delete_file)
    tx._apply(*producer._commit())
    tx.commit_transaction()
    return deletes
