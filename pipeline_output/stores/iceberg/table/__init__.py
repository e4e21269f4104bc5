"""A native table as it is: refs, branches and history, the snapshot log, partitions, expressions,
properties, reads, and the catalog."""
