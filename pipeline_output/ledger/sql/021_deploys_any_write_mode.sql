-- Write modes are a registry (issue 43: `contract/spec.py`, `WRITE_MODES`), checked before any
-- write (each arm refuses a mode it has no handler for), so the deploy log records whatever write
-- mode an arm executed: adding a write mode needs no migration.

ALTER TABLE pipeline_output.deploys DROP CONSTRAINT IF EXISTS deploys_write_mode_check;
