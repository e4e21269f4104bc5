"""The vocabulary every layer speaks, with no I/O: dataset specs, windows and partition slices, the
decision table and write results, checked input, pushed predicates and the `Store` protocol.
Its modules, by concept: `docs/concepts.md`, "Where each concept lives"."""
