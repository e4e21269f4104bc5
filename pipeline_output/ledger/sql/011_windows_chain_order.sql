-- Tighten the window chain (found in review): the chain order must be the seq order, and bounds
-- must be partition keys in their canonical, byte-sortable form.
--   * prev_seq (= seq - 1) with prev_high_key must name the predecessor row exactly, so a window
--     cannot continue the chain with a seq out of order;
--   * keys are 20-digit zero-padded integers, ISO dates, or ISO timestamps with microseconds, so a
--     text comparison is a watermark comparison ('5' after '000...10' is refused).

ALTER TABLE pipeline_output.windows
    ADD COLUMN prev_seq integer GENERATED ALWAYS AS (seq - 1) STORED;

ALTER TABLE pipeline_output.windows
    ADD CONSTRAINT windows_unique_seq_high UNIQUE (dataset, seq, high_key);

ALTER TABLE pipeline_output.windows
    ADD CONSTRAINT windows_chain_in_seq_order FOREIGN KEY (dataset, prev_seq, prev_high_key)
        REFERENCES pipeline_output.windows (dataset, seq, high_key);

ALTER TABLE pipeline_output.windows
    ADD CONSTRAINT windows_key_format CHECK (
        high_key ~ '^([0-9]{20}|[0-9]{4}-[0-9]{2}-[0-9]{2}(T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6})?)$'
        AND (low_key IS NULL OR low_key ~ '^([0-9]{20}|[0-9]{4}-[0-9]{2}-[0-9]{2}(T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6})?)$')
    );
