-- Limits from SQL (issue 49): what pglimit.check needs to decide as
-- POST /check does, without the service. Both are written by `pglimit
-- serve` at start-up and on every reload, and by `pglimit policies push`.
--
-- The policies in force, compiled: one row per policy, its identifiers,
-- buckets (limit, window in ms, algorithm, calendar zone, lockout) and
-- file overrides, whose exact values are keyed as API overrides' are
-- ("hmac:<hex>"), so that no identifier from the policy file is stored.
--   source     the short hash of the policy file's text (GET /readyz's)
CREATE TABLE pglimit_policies (
    name       text        PRIMARY KEY,
    definition jsonb       NOT NULL,
    source     text        NOT NULL,
    pushed_at  timestamptz NOT NULL DEFAULT now()
);

-- PGLIMIT_KEY_SECRET as the two HMAC-SHA256 pads the SQL functions key
-- with (the secret zero-padded to 64 bytes, XOR 0x36 and 0x5c): as good as
-- the secret, so only its owner reads it. Applications reach it only
-- through pglimit's SECURITY DEFINER functions.
--   fingerprint  8 hex digits of SHA-256 over both pads, to tell two secrets apart
CREATE TABLE pglimit_key_secret (
    id          integer     PRIMARY KEY CHECK (id = 1),
    inner_pad   bytea       NOT NULL CHECK (octet_length(inner_pad) = 64),
    outer_pad   bytea       NOT NULL CHECK (octet_length(outer_pad) = 64),
    fingerprint text        NOT NULL,
    written_at  timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON pglimit_key_secret FROM PUBLIC;
-- Nor any role that default privileges gave it at creation (Supabase gives
-- every table of schema public to its anon and authenticated roles).
DO $$
DECLARE r regrole;
BEGIN
    FOR r IN SELECT DISTINCT a.grantee::regrole FROM pg_class c, aclexplode(c.relacl) AS a
             WHERE c.oid = 'pglimit_key_secret'::regclass AND a.grantee NOT IN (0, c.relowner) LOOP
        EXECUTE format('REVOKE ALL ON pglimit_key_secret FROM %s', r);
    END LOOP;
END
$$;
