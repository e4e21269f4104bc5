-- Incremental downstreams (issue 46): the range a downstream's run is reading now — its `to`,
-- the upstream's head when the run read it — written before the run reads and removed with the
-- ledger record of the range (consumed_changes). Expiry keeps `to_snapshot` like a consumer's
-- position: a run that commits after an expiry, or is killed between its commit and its ledger
-- record (a first run above all, of which consumed_changes knows nothing yet), finds its `to`
-- still there on its next run instead of reading the whole upstream again. A killed run leaves
-- its row until the downstream's next run replaces it.
CREATE TABLE pipeline_output.consuming_changes (
    dataset      text NOT NULL,
    upstream     text NOT NULL,
    to_snapshot  bigint NOT NULL,
    run_id       text,
    started_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (dataset, upstream)
);
CREATE INDEX consuming_changes_upstream ON pipeline_output.consuming_changes (upstream);
