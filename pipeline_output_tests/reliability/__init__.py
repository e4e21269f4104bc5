"""Reliability scenarios across layers: a model-based suite, faults, concurrency, hostile input, secrets, scale-out (docs/reliability.md)."""
