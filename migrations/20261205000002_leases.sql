-- Concurrency buckets' leases (issue 30). A concurrency bucket's row keeps
-- one expiry per held slot in `log` (the decision needs nothing more); a
-- lease row says which slots a lease holds, so that releasing or renewing
-- it by its id can find them: one row per concurrency bucket of the check
-- that took it.
--   id        SHA-256 of the lease id the caller holds (never stored as given)
--   key       the bucket's key (HMAC, as in pglimit_buckets)
--   slots     the check's cost: the entries this lease holds in that row
--   lease_us  the bucket's lease time, by which a renewal extends it
--   released  released early; kept until it would have ended, so that a
--             second release answers "already released"
-- A row past expires_at is equivalent to no row, and the cleanup deletes it.
CREATE TABLE pglimit_leases (
    id         bytea       NOT NULL CHECK (octet_length(id) = 32),
    key        bytea       NOT NULL CHECK (octet_length(key) = 32),
    slots      bigint      NOT NULL CHECK (slots > 0),
    lease_us   bigint      NOT NULL CHECK (lease_us > 0),
    expires_at timestamptz NOT NULL,
    released   boolean     NOT NULL DEFAULT false,
    PRIMARY KEY (id, key)
);
CREATE INDEX pglimit_leases_expires_at ON pglimit_leases (expires_at);
