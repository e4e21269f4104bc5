"""Maintenance of a native table: compaction, snapshot expiry, orphan removal and health."""
