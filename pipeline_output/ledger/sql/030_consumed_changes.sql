-- Incremental downstreams (issue 46): each range (from, to] of an upstream's snapshots a
-- downstream consumed, recorded after the downstream's own commit (whose snapshot summary carries
-- the same range: the atomic record a run repairs this table from). `downstream_snapshot` is the
-- downstream's snapshot that applied it (NULL: the run changed nothing in the downstream);
-- `full_refresh` says the range was read from scratch (first run, or its start was expired).
CREATE TABLE pipeline_output.consumed_changes (
    id                   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    dataset              text NOT NULL,
    upstream             text NOT NULL,
    from_snapshot        bigint,
    to_snapshot          bigint NOT NULL,
    downstream_snapshot  bigint,
    full_refresh         boolean NOT NULL DEFAULT false,
    run_id               text,
    recorded_at          timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX consumed_changes_position ON pipeline_output.consumed_changes (dataset, upstream, id DESC);
CREATE INDEX consumed_changes_upstream ON pipeline_output.consumed_changes (upstream);
CREATE UNIQUE INDEX consumed_changes_once
    ON pipeline_output.consumed_changes (dataset, upstream, downstream_snapshot)
    WHERE downstream_snapshot IS NOT NULL;
