-- Window bounds keep their time zone (issue: a timestamptz watermark applied 0 rows under a non-UTC
-- server TimeZone): an aware timestamp bound is encoded in UTC with a trailing 'Z', a naive one has
-- no suffix. Allow the suffix in the canonical key format; the suffix is the last character, so a
-- text comparison of keys of one chain is still a watermark comparison.

ALTER TABLE pipeline_output.windows DROP CONSTRAINT windows_key_format;

ALTER TABLE pipeline_output.windows
    ADD CONSTRAINT windows_key_format CHECK (
        high_key ~ '^([0-9]{20}|[0-9]{4}-[0-9]{2}-[0-9]{2}(T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}Z?)?)$'
        AND (low_key IS NULL OR low_key ~ '^([0-9]{20}|[0-9]{4}-[0-9]{2}-[0-9]{2}(T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}Z?)?)$')
    );
