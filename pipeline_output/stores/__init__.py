"""Storage arms: each implements every write mode and reads (`iceberg` native, `postgres` legacy)."""
