"""Tests every arm must pass alike: each test runs once per arm (`conftest.arm`)."""
