"""The use cases, Dagster-free: publishing, delta windows, write-audit-publish, reads, the canary,
time travel, maintenance and the model node, composed by `runtime.connect`.
Its modules, by concept: `docs/concepts.md`, "Where each concept lives"."""
