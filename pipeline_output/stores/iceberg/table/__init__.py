"""A native table as it is: naming and loading, its properties, refs and history, partitions, reads
and the catalog. Its modules, by concept: `docs/concepts.md`, "Where each concept lives"."""
