-- The control plane: dataset registry, deploys per arm, mode flips with history, parity results.
-- Applied once, in a transaction, by pipeline_output.ledger.migrations (which creates the schema
-- and pipeline_output.schema_migrations itself). Never edit an applied file: add a new one.

CREATE TABLE pipeline_output.datasets (
    name          text PRIMARY KEY,
    primary_key   text[] NOT NULL DEFAULT '{}',
    -- The Arrow schema (IPC-serialised) the legacy arm restores types from, plus a readable copy.
    arrow_schema  bytea,
    schema_text   jsonb,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE pipeline_output.deploys (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    dataset           text NOT NULL,
    arm               text NOT NULL CHECK (arm IN ('pg', 'iceberg')),
    run_id            text,
    strategy          text,
    write_mode        text CHECK (write_mode IN ('replace', 'upsert', 'append', 'append_new', 'sync')),
    first_deploy      boolean,
    "window"          text,
    window_key        text,
    status            text NOT NULL CHECK (status IN ('succeeded', 'failed', 'diverged')),
    rows_in           bigint,
    rows_inserted     bigint,
    rows_updated      bigint,
    rows_deleted      bigint,
    rows_unchanged    bigint,
    rows_preserved    bigint,
    rows_skipped      bigint,
    rows_total_after  bigint,
    snapshot_id       bigint,
    started_at        timestamptz,
    finished_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    error             text
);
CREATE INDEX deploys_dataset_arm ON pipeline_output.deploys (dataset, arm, id DESC);
CREATE INDEX deploys_succeeded ON pipeline_output.deploys (dataset, arm, id DESC)
    WHERE status = 'succeeded';

CREATE TABLE pipeline_output.mode_flips (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    dataset    text NOT NULL,
    from_mode  text CHECK (from_mode IN ('pg', 'iceberg', 'dual')),
    to_mode    text NOT NULL CHECK (to_mode IN ('pg', 'iceberg', 'dual')),
    who        text NOT NULL,
    at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    reason     text
);
CREATE INDEX mode_flips_dataset ON pipeline_output.mode_flips (dataset, id);

-- The current flip per dataset (one row), pointing at the history row that set it.
CREATE TABLE pipeline_output.dataset_modes (
    dataset     text PRIMARY KEY,
    mode        text NOT NULL CHECK (mode IN ('pg', 'iceberg', 'dual')),
    flip_id     bigint NOT NULL REFERENCES pipeline_output.mode_flips (id),
    updated_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE TABLE pipeline_output.parity_results (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    dataset         text NOT NULL,
    at              timestamptz NOT NULL DEFAULT clock_timestamp(),
    run_id          text,
    passed          boolean NOT NULL,
    pg_count        bigint,
    iceberg_count   bigint,
    -- {"only_in_pg": [...keys], "only_in_iceberg": [...keys]} (up to a few examples per side)
    differing_keys  jsonb NOT NULL DEFAULT '{}'::jsonb,
    details         jsonb NOT NULL DEFAULT '{}'::jsonb
);
CREATE INDEX parity_results_dataset ON pipeline_output.parity_results (dataset, id DESC);
