"""Tests of `pipeline_output/commands/`."""
