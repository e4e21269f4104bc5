"""Packaged Dagster instance files: dagster.yaml and workspace.yaml, copied into DAGSTER_HOME."""
