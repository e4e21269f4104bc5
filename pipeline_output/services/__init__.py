"""The use cases, Dagster-free: publish, delta windows, write-audit-publish, reads, sources, the
canary and parity, time travel, maintenance, doctor, the model node, and the composition root
(`runtime.connect`)."""
