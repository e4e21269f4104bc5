"""The demo dataspace: a small shop whose Postgres source tables the demo seeds and grows.

`shop_data` owns the source tables in schema `shop` (deterministic generators, `seed`, `tick`,
`counts`, reading them back with polars); `computes` owns the pure polars transformations of the
demo datasets (one per write strategy) and their descriptions (`DATASETS`, `SOURCES`), which the
Dagster layer wraps. Nothing in this package imports Dagster.
"""
