"""Tests of the use cases (services/): publish, windows, write-audit-publish, reads, canary, time travel, maintenance, doctor, the runtime."""
