-- Write-audit-publish, rollback and the drain record (issue 15).
--
-- audits: one row per (dataset, run) whose native writes were staged on the Iceberg branch
-- `audit-<run id>` instead of main. `state` moves staged -> published (main fast-forwarded to the
-- audited snapshot) or staged -> failed (a blocking check failed, or main moved meanwhile: the
-- branch is kept for inspection) -> dropped (maintenance removed the branch after retention).
-- `gating_checks` are the blocking checks that must pass before the publish.
CREATE TABLE pipeline_output.audits (
    id                     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    dataset                text NOT NULL,
    run_id                 text NOT NULL,
    branch                 text NOT NULL,
    mode                   text NOT NULL CHECK (mode IN ('iceberg', 'dual')),
    state                  text NOT NULL DEFAULT 'staged'
                           CHECK (state IN ('staged', 'published', 'failed', 'dropped')),
    base_snapshot_id       bigint,
    snapshot_id            bigint,
    gating_checks          text[] NOT NULL DEFAULT '{}',
    reason                 text,
    staged_at              timestamptz NOT NULL DEFAULT clock_timestamp(),
    decided_at             timestamptz,
    CONSTRAINT audits_one_per_run UNIQUE (dataset, run_id)
);
CREATE INDEX audits_dataset ON pipeline_output.audits (dataset, id DESC);
CREATE INDEX audits_open ON pipeline_output.audits (state) WHERE state IN ('staged', 'failed');

-- Every write an audit staged, in order: what the publish replays on the legacy arm (dual: the
-- checked frame as Arrow IPC), which window attempt it was, and its counters for the deploy log.
CREATE TABLE pipeline_output.audit_writes (
    audit_id      bigint NOT NULL REFERENCES pipeline_output.audits (id) ON DELETE CASCADE,
    seq           integer NOT NULL,
    snapshot_id   bigint,
    strategy      text NOT NULL,
    window_key    text,
    marker        text,
    result        jsonb NOT NULL DEFAULT '{}'::jsonb,
    frame         bytea,
    PRIMARY KEY (audit_id, seq)
);

-- A window whose write is staged on an audit branch: applied only when the audit publishes.
ALTER TABLE pipeline_output.windows DROP CONSTRAINT windows_state_check;
ALTER TABLE pipeline_output.windows ADD CONSTRAINT windows_state_check
    CHECK (state IN ('planned', 'applying', 'staged', 'applied', 'failed'));

-- Rollbacks of a dataset's native table: who, when, why, from which snapshot to which, and how
-- many applied windows went back to planned.
CREATE TABLE pipeline_output.rollbacks (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    dataset           text NOT NULL,
    from_snapshot_id  bigint,
    to_snapshot_id    bigint NOT NULL,
    who               text NOT NULL,
    run_id            text,
    reason            text,
    windows_reset     integer NOT NULL DEFAULT 0,
    at                timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX rollbacks_dataset ON pipeline_output.rollbacks (dataset, id DESC);

-- Drains of the legacy arm (a rollback of the native arm to before a drain is refused).
CREATE TABLE pipeline_output.drains (
    id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    dataset  text NOT NULL,
    rows     bigint NOT NULL,
    at       timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX drains_dataset ON pipeline_output.drains (dataset, id DESC);
