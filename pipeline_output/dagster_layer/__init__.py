"""The Dagster layer: a thin mapping from Dagster (assets, the IO manager, sensors, checks, jobs,
the Component) onto the services; it decides nothing the CLI also needs.
Its modules, by concept: `docs/concepts.md`, "Where each concept lives".
"""
