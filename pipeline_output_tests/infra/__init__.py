"""Tests of the infrastructure (infra/): settings, the embedded server, the deployed instance files."""
