"""A native snapshot: data and delete files, manifests, the snapshot producers, and the one commit."""
