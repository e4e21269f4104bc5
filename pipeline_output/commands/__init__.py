"""The CLI: one module per command or command group, registered on `pipeline_output.cli`'s `main`
group. Its modules, by concept: `docs/concepts.md`, "Where each concept lives"."""
