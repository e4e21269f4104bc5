"""Tests of `pipeline_output/stores/`."""
