"""The demo shop: Postgres source tables the demo seeds and grows, one dataset per write strategy as
pure polars computes, and its code location (the only module here that imports Dagster).
Its modules, by concept: `docs/concepts.md`, "Where each concept lives".
"""
