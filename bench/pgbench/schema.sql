-- The raw-Postgres baseline's table (bench/run): one row per key, as small
-- as a fixed window can be.
CREATE TABLE raw_limit (
    key bytea PRIMARY KEY,
    count bigint NOT NULL,
    reset_at timestamptz NOT NULL
);
