-- Who is being limited (issue 48): denials counted per minute and bucket
-- key, for GET /admin/top. Each instance counts in memory and adds its
-- counts every few seconds (count = count + the instance's), so the sum of
-- a key's rows is exact across instances.
--   minute    the minute the denials were answered in (the instance's clock)
--   key       the bucket's key (HMAC, as in pglimit_buckets)
--   policy    the policy's name, or _adhoc for ad hoc keys
--   bucket    the bucket that denied
--   shown     the normalised values of the bucket's identifiers its policy
--             marks `show = true`; NULL otherwise (only the key is kept)
--   count     denials that minute
-- UNLOGGED: a crash loses recent counts, not limits; old minutes are
-- deleted by the cleanup past PGLIMIT_TOP_RETENTION. In Citus mode it stays
-- a plain table on the coordinator.
CREATE UNLOGGED TABLE pglimit_denials (
    minute timestamptz NOT NULL,
    key    bytea       NOT NULL CHECK (octet_length(key) = 32),
    policy text        NOT NULL,
    bucket text        NOT NULL,
    shown  jsonb,
    count  bigint      NOT NULL CHECK (count > 0),
    PRIMARY KEY (key, minute)
);
CREATE INDEX pglimit_denials_policy_minute ON pglimit_denials (policy, minute);
CREATE INDEX pglimit_denials_minute ON pglimit_denials (minute);
