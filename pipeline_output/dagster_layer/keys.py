"""Names shared by the Dagster layer: resource keys and metadata keys."""

IO_MANAGER_KEY = "pipeline_output_io"
SPEC_METADATA_KEY = "pipeline_output/contract/spec"
SOURCE_METADATA_KEY = "pipeline_output/source"
MODE_OVERRIDE_KEY = "pipeline_output/mode_override"
ALL_DATASETS_JOB = "all_datasets"
DELTA_INPUT_KEY = "pipeline_output/delta_input"
AUDIT_OVERRIDE_KEY = "pipeline_output/audit_override"
MAINTENANCE_JOB = "table_maintenance"  # compaction, snapshot expiry, orphan removal
MAINTENANCE_SCHEDULE = "table_maintenance_schedule"
MAINTENANCE_SENSOR = "table_maintenance_sensor"  # opt-in: maintenance past the health thresholds
HEALTH_JOB = "table_health"  # runs every dataset's `table_health` check
HEALTH_CHECK = "table_health"
