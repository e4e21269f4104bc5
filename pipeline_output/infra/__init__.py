"""Infrastructure: the one reader of the environment, Postgres sessions and the embedded server,
the Dagster home, every lock. Its modules, by concept: `docs/concepts.md`, "Where each concept
lives"."""
