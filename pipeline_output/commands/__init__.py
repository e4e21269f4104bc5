"""CLI commands, one module each; `pipeline_output.cli` registers them on the `main` group."""
