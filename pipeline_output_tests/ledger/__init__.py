"""Tests of `pipeline_output/ledger/`."""
