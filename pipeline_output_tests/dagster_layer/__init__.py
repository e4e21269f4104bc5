"""Tests of `pipeline_output/dagster_layer/`."""
