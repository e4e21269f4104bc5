-- The watermark ledger: each delta dataset's windows (low, high], in a chain the database itself
-- keeps contiguous and non-overlapping:
--   * bounds are stored as their partition keys (zero-padded integers / fixed-width UTC ISO
--     timestamps) compared byte-wise (COLLATE "C"), so key order is watermark order;
--   * every window but the first names its predecessor's high (prev_high_key, a foreign key onto
--     (dataset, high_key)) and must start exactly there (low_key = prev_high_key): no gaps;
--   * at most one window starts at any point (UNIQUE NULLS NOT DISTINCT (dataset, low_key)) and at
--     most one is first (seq = 1 exactly when prev_high_key IS NULL): no overlaps, no branches.

CREATE TABLE pipeline_output.windows (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    dataset         text NOT NULL,
    seq             integer NOT NULL CHECK (seq >= 1),
    low_key         text COLLATE "C",
    high_key        text COLLATE "C" NOT NULL,
    prev_high_key   text COLLATE "C",
    partition_key   text NOT NULL,
    state           text NOT NULL DEFAULT 'planned'
                    CHECK (state IN ('planned', 'applying', 'applied', 'failed')),
    attempts        integer NOT NULL DEFAULT 0,
    run_id          text,
    iceberg_snapshot_id bigint,
    pg_deploy_id    bigint,
    rows_read       bigint,
    rows_written    bigint,
    error           text,
    planned_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    started_at      timestamptz,
    applied_at      timestamptz,
    updated_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT windows_low_below_high CHECK (low_key IS NULL OR low_key < high_key),
    CONSTRAINT windows_first_has_no_prev CHECK ((seq = 1) = (prev_high_key IS NULL)),
    CONSTRAINT windows_contiguous CHECK (prev_high_key IS NULL OR prev_high_key = low_key),
    CONSTRAINT windows_unique_seq UNIQUE (dataset, seq),
    CONSTRAINT windows_unique_high UNIQUE (dataset, high_key),
    CONSTRAINT windows_unique_low UNIQUE NULLS NOT DISTINCT (dataset, low_key),
    CONSTRAINT windows_unique_partition UNIQUE (dataset, partition_key),
    CONSTRAINT windows_chain FOREIGN KEY (dataset, prev_high_key)
        REFERENCES pipeline_output.windows (dataset, high_key)
);
CREATE INDEX windows_state ON pipeline_output.windows (dataset, state);
