"""Storage arms: each implements every write mode and reads (`iceberg` native, `postgres` legacy).
Its modules, by concept: `docs/concepts.md`, "Where each concept lives"."""
