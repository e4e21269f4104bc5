"""Tests of `pipeline_output/demo/`."""
