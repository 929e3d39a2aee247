-- The contact form's table and the role its code connects as (node/,
-- python/). Run as the database's owner after `pglimit migrate`.
CREATE TABLE IF NOT EXISTS contact_messages (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    recipient  text        NOT NULL,
    sender     text        NOT NULL,
    body       text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

DO $$ BEGIN
    CREATE ROLE contact_app LOGIN;
EXCEPTION WHEN duplicate_object THEN NULL;
END $$;

-- The form's role may store messages and enforce the contact policy, nothing else of pglimit's.
GRANT INSERT, SELECT (id) ON contact_messages TO contact_app;
GRANT USAGE ON SCHEMA pglimit TO contact_app;
GRANT EXECUTE ON FUNCTION pglimit.enforce(text, jsonb, bigint) TO contact_app;
