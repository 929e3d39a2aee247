-- Supabase-style roles for pglimit's SQL interface: requests come in
-- through the login role `authenticator`, which switches (SET ROLE) to
-- `anon` or to `authenticated`. Signed-in users may check a limit, nothing
-- more; anonymous ones may call nothing of pglimit's. Run as the
-- database's owner (on Supabase: `postgres`, in the SQL editor) after
-- `pglimit migrate`; the roles are created only where they are missing.
DO $$ BEGIN
    CREATE ROLE anon NOLOGIN NOINHERIT;
EXCEPTION WHEN duplicate_object THEN NULL;
END $$;
DO $$ BEGIN
    CREATE ROLE authenticated NOLOGIN NOINHERIT;
EXCEPTION WHEN duplicate_object THEN NULL;
END $$;
DO $$ BEGIN
    CREATE ROLE authenticator LOGIN NOINHERIT;
EXCEPTION WHEN duplicate_object THEN NULL;
END $$;
GRANT anon, authenticated TO authenticator;

-- Signed-in users: checks of named policies only; no enforce, reset or release.
GRANT USAGE ON SCHEMA pglimit TO authenticated;
GRANT EXECUTE ON FUNCTION pglimit.check(text, jsonb, bigint) TO authenticated;

-- Supabase's default privileges give anon and authenticated every table
-- and sequence created in schema public, pglimit's among them (the
-- counts by hashed key, the compiled policies, the migrations' record;
-- the migration itself takes the key secret back): take those back. Run this again after each upgrade that adds a table,
-- or give pglimit a schema of its own (PGLIMIT_DB_SCHEMA), which they miss.
DO $$
DECLARE
    t regclass;
BEGIN
    FOR t IN SELECT c.oid::regclass FROM pg_class c
             WHERE c.relkind IN ('r', 'p', 'v', 'S') AND (c.relname LIKE 'pglimit\_%' OR c.relname = '_sqlx_migrations')
               AND c.relnamespace = (SELECT relnamespace FROM pg_class WHERE oid = to_regclass('pglimit_buckets'))
    LOOP
        EXECUTE format('REVOKE ALL ON %s FROM anon, authenticated', t);
    END LOOP;
END $$;
