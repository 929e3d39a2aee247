-- A cap enforced by the database itself: at most 3 posts per author per
-- hour, whatever code inserts them. Run as the database's owner after
-- `pglimit migrate` and `pglimit policies push` (which stores the key
-- secret the ad hoc key is hashed with; no policy is needed).
CREATE TABLE IF NOT EXISTS posts (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    author_id  bigint      NOT NULL,
    body       text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- Takes one from the author's hourly allowance; the 4th post in an hour
-- raises SQLSTATE RL429, which aborts the INSERT and its transaction.
CREATE OR REPLACE FUNCTION posts_rate_limit() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM * FROM pglimit.enforce('posts:' || NEW.author_id, 3, '1h', 'fixed_window');
    RETURN NEW;
END $$;

CREATE OR REPLACE TRIGGER posts_rate_limit BEFORE INSERT ON posts
    FOR EACH ROW EXECUTE FUNCTION posts_rate_limit();

DO $$ BEGIN
    CREATE ROLE blog_app LOGIN;
EXCEPTION WHEN duplicate_object THEN NULL;
END $$;

-- The trigger runs as the inserting role, which needs EXECUTE on the ad hoc enforce.
GRANT INSERT ON posts TO blog_app;
GRANT USAGE ON SCHEMA pglimit TO blog_app;
GRANT EXECUTE ON FUNCTION pglimit.enforce(text, bigint, text, text, bigint, text) TO blog_app;
