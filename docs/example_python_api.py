import os

import polars as pl

from pipeline_output import DatasetSpec, connect

# The control-plane Postgres (a libpq URI) and the Iceberg catalog: a pyiceberg Catalog, or its
# properties. connect() creates the control-plane schema and the namespace when they are missing.
runtime = connect(
    pg_url=os.environ["CONTROL_PLANE_URL"],  # postgresql://user:password@host:5432/db
    catalog={
        "type": "sql",
        "uri": os.environ["CATALOG_URI"],  # postgresql+psycopg://user:password@host:5432/db
        "warehouse": os.environ["WAREHOUSE"],  # file:///srv/warehouse, s3://bucket/path
    },
    namespace="datasets",
)

orders = DatasetSpec(name="orders", primary_key=("order_id",), mode="iceberg")
frame = pl.DataFrame({"order_id": [1, 2, 3], "amount": [9.5, 20.0, 3.25]})

publisher = runtime.publisher
mode = publisher.resolve(orders)  # run override -> flip -> declared mode= -> project default
result = publisher.publish(orders, frame, mode=mode, run_id="manual-2026-12-05")
print(result.primary.write_mode, result.primary.snapshot_id)  # replace <snapshot id>
print(publisher.read(orders, mode=mode))
