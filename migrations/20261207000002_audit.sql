-- The audit log of administrative acts (GET /admin/audit): blocks,
-- unblocks, resets with an admin token and API overrides, each written in
-- the transaction of its act; policy reloads and start-ups, written alone.
-- `actor` is an admin token's name or fingerprint ("token:" and 8 hex
-- digits of its SHA-256), never a token, or "system". `detail` says what
-- changed, keys only by a hex prefix of their HMAC. Rows are only ever
-- added; the cleanup deletes those past PGLIMIT_AUDIT_RETENTION. In Citus
-- mode it stays a plain table on the coordinator, as pglimit_overrides.
CREATE TABLE pglimit_audit (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    actor      text        NOT NULL,
    request_id text,
    action     text        NOT NULL CHECK (action IN ('block', 'unblock', 'override_set',
                   'override_removed', 'reset', 'policies_reloaded', 'started')),
    target     text        NOT NULL,
    detail     jsonb       NOT NULL DEFAULT '{}'
);
-- Pages are read newest first by id, filtered by action or target; the
-- cleanup deletes by age.
CREATE INDEX pglimit_audit_action ON pglimit_audit (action, id);
CREATE INDEX pglimit_audit_target ON pglimit_audit (target, id);
CREATE INDEX pglimit_audit_at ON pglimit_audit (at);

-- Rows are never changed, and the database says so too: the service's role
-- may UPDATE its other tables, so a grant cannot forbid it here.
CREATE FUNCTION pglimit_audit_unchanged() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'pglimit_audit rows are never updated (row %)', OLD.id;
END
$$;
CREATE TRIGGER pglimit_audit_unchanged BEFORE UPDATE ON pglimit_audit
    FOR EACH ROW EXECUTE FUNCTION pglimit_audit_unchanged();
