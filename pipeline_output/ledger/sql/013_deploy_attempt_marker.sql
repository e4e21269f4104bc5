-- The legacy arm's exact attempt marker (issue 12): a window attempt's marker is recorded on the
-- deploy row the legacy arm writes inside the same transaction as the dataset's rows, so exactly-once
-- repair after a crash finds "did this attempt commit?" by equality, as it does in the Iceberg
-- snapshot summary, instead of comparing times.

ALTER TABLE pipeline_output.deploys ADD COLUMN attempt_marker text;

CREATE INDEX deploys_attempt_marker ON pipeline_output.deploys (dataset, arm, attempt_marker)
    WHERE attempt_marker IS NOT NULL;
