"""A native write before its commit: its files prepared before the lock, the file-level merges and
which rows they touch, streaming batches to files. Its modules, by concept: `docs/concepts.md`,
"Where each concept lives"."""
