-- pglimit's tables and indexes. Migrations are append-only: a change to the
-- schema is a new file, never an edit here. The functions that decide are
-- code, not schema: src/storage/postgres/sql/, installed by each build
-- under a schema named for its version (schema.rs).
--
-- One row per bucket. The key is HMAC-SHA256 of what identifies the bucket
-- (policy, bucket, algorithm, normalised identifiers), so no raw identifier
-- is ever stored. What each algorithm keeps in a row:
--   fixed_window    count; expires_at = window end
--   sliding_window  count (current window), prev_count; expires_at = current window end + window
--   sliding_log     log (one timestamp per admitted unit); expires_at = newest + window
--   token_bucket    tat_us (theoretical arrival time); expires_at = tat
-- In every case a row whose expires_at has passed is equivalent to no row,
-- which is what the cleanup relies on.
CREATE TABLE pglimit_buckets (
    key        bytea       PRIMARY KEY CHECK (octet_length(key) = 32),
    count      bigint      NOT NULL CHECK (count >= 0),
    expires_at timestamptz NOT NULL,
    prev_count bigint      NOT NULL DEFAULT 0,
    tat_us     bigint,
    log        bigint[]
) WITH (fillfactor = 70);
-- fillfactor leaves room on each page so that counter updates (which touch no
-- indexed column) stay HOT updates.

-- Serves the cleanup, which deletes the oldest expired rows first.
CREATE INDEX pglimit_buckets_expires_at ON pglimit_buckets (expires_at);

-- One row per running service instance, refreshed every 2 s, so that an
-- instance that loses Postgres knows how many were sharing it and can keep
-- to its share of each limit from memory.
CREATE TABLE pglimit_instances (
    id        bytea       PRIMARY KEY CHECK (octet_length(id) = 16),
    last_seen timestamptz NOT NULL
);

-- Acting on limits: blocks (an operator's, or a bucket's lockout) and the
-- generation that tells instances an action happened.

-- A blocked key is denied until `until`, whatever its bucket's counts say.
-- Keys are bucket keys (HMAC, as in pglimit_buckets): no raw identifier is
-- stored. `kind` is 'admin' (POST /admin/blocks) or 'lockout' (a bucket
-- with block_for denied); `policy` and `bucket` are names from the policy
-- file, `reason` the operator's text. A row past `until` is equivalent to
-- no row, and the cleanup deletes it.
CREATE TABLE pglimit_blocks (
    key        bytea       PRIMARY KEY CHECK (octet_length(key) = 32),
    until      timestamptz NOT NULL,
    kind       text        NOT NULL CHECK (kind IN ('admin', 'lockout')),
    policy     text,
    bucket     text,
    reason     text,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX pglimit_blocks_until ON pglimit_blocks (until);

-- Bumped in the transaction of every reset, block and unblock, which also
-- notifies channel pglimit_actions with '<generation> <hex key>,...'.
-- An instance that reads a generation it has not heard of missed a
-- notification, and forgets every denial it remembers.
CREATE TABLE pglimit_actions (
    id         integer PRIMARY KEY CHECK (id = 1),
    generation bigint  NOT NULL
);
INSERT INTO pglimit_actions VALUES (1, 0);
