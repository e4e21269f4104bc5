-- The legacy arm's row store: one jsonb document per dataset row (the seed's dataset_rows).
--
-- row_index orders a dataset's rows deterministically (reads are ORDER BY row_index). pk is the
-- primary key rendered canonically as text (NULL for keyless datasets). The key index is NOT
-- unique on purpose: the native arm accepts repeated keys under append_always and a windowed
-- replace, so a unique index would make the legacy arm reject writes the native arm accepts.
-- Matching writes (upsert, append_new, sync) are set-based joins serialized per dataset by a
-- transaction-level advisory lock, and the compute's own keys are checked unique before writing.

CREATE TABLE pipeline_output.dataset_rows (
    dataset_id  text   NOT NULL,
    row_index   bigint NOT NULL,
    pk          text,
    data        jsonb  NOT NULL,
    PRIMARY KEY (dataset_id, row_index)
);
CREATE INDEX dataset_rows_pk ON pipeline_output.dataset_rows (dataset_id, pk)
    WHERE pk IS NOT NULL;
