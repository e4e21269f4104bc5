"""A native snapshot: data and delete files, manifests, the snapshot producers and the one commit.
Its modules, by concept: `docs/concepts.md`, "Where each concept lives"."""
