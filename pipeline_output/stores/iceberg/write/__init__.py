"""A native write: its input prepared before the lock, the file-level merges, which files they touch,
reading those files, and streaming batches to files."""
