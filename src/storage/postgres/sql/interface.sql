-- pglimit's SQL interface (docs/sql.md): checks, resets and releases made
-- in the caller's own transaction, decided as POST /check decides them.
-- Created by `pglimit migrate` in schema pglimit (or PGLIMIT_DB_SCHEMA),
-- replaced by each build that installs its functions, so that grants to
-- an application's role survive upgrades.
--
-- Each function runs as its owner (SECURITY DEFINER), which reads the key
-- secret and the buckets; its search_path is fixed when it is created
-- (this build's functions, the tables' schema, pg_temp last), so that a
-- caller's objects are never found first. Every statement beneath it keeps
-- one generic plan (plan_cache_mode): planned anew for each call's keys,
-- as the default does, a check took twice as long. PUBLIC may not execute them: a
-- role needs USAGE on the schema and EXECUTE, and gets nothing else.

-- What a check answers: the fields of /check's JSON body. A type is not
-- replaced as a function is: created once, it is changed by a build that
-- needs to (a column added at the end keeps callers' code working).
DO $$ BEGIN
    CREATE TYPE {{schema}}.decision AS (
        allowed          boolean,     -- admitted (in shadow mode always; see would_allow)
        "limit"          bigint,      -- the headline bucket's limit
        remaining        bigint,
        reset_at         timestamptz, -- when the headline bucket is full again
        retry_after_s    bigint,      -- when denied: whole seconds to wait
        buckets          jsonb,       -- each bucket: name, algorithm, allowed, limit, remaining, reset_at, blocked
        would_allow      boolean,     -- shadow mode: what enforcing would have answered
        blocked_by       text,        -- the bucket whose key is blocked, when that is why
        "override"       jsonb,       -- the override that matched: {index} or {id}, and action
        lease            text,        -- a concurrency bucket's lease, for release
        lease_expires_at timestamptz
    );
EXCEPTION WHEN duplicate_object THEN NULL;
END $$;

-- Checks policy `policy` over `identifiers` (a JSON object of strings),
-- taking `cost` (0 peeks). A denial is an answer, not an error.
CREATE OR REPLACE FUNCTION {{schema}}.check(policy text, identifiers jsonb, cost bigint DEFAULT 1)
RETURNS {{schema}}.decision
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT SET plan_cache_mode = force_generic_plan
AS $$
DECLARE d {{schema}}.decision;
BEGIN
    SELECT a.* INTO d FROM pglimit_sql_check(policy, identifiers, cost) AS a;
    RETURN d;
END
$$;

-- Checks ad hoc key `key`: `limit` per `window` ("15m", "1 calendar
-- month"), by `algorithm`.
CREATE OR REPLACE FUNCTION {{schema}}.check(key text, "limit" bigint, "window" text, algorithm text, cost bigint DEFAULT 1,
                                 timezone text DEFAULT NULL)
RETURNS {{schema}}.decision
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT SET plan_cache_mode = force_generic_plan
AS $$
DECLARE d {{schema}}.decision;
BEGIN
    SELECT a.* INTO d FROM pglimit_sql_adhoc_check(key, $2, $3, algorithm, cost, timezone) AS a;
    RETURN d;
END
$$;

-- The same with the window as an interval (days of 24 hours, no months).
CREATE OR REPLACE FUNCTION {{schema}}.check(key text, "limit" bigint, "window" interval, algorithm text, cost bigint DEFAULT 1)
RETURNS {{schema}}.decision
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT SET plan_cache_mode = force_generic_plan
AS $$
DECLARE d {{schema}}.decision;
BEGIN
    SELECT a.* INTO d FROM pglimit_sql_adhoc_check(key, $2, $3, algorithm, cost) AS a;
    RETURN d;
END
$$;

-- As check, but a denial raises SQLSTATE RL429 (retry_after_s and the
-- other figures as JSON in its DETAIL), aborting the caller's transaction.
CREATE OR REPLACE FUNCTION {{schema}}.enforce(policy text, identifiers jsonb, cost bigint DEFAULT 1)
RETURNS {{schema}}.decision
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT SET plan_cache_mode = force_generic_plan
AS $$
DECLARE d {{schema}}.decision;
BEGIN
    SELECT e.* INTO d FROM pglimit_sql_check(policy, identifiers, cost) AS a,
                      pglimit_sql_enforced(a, format('policy %s', to_json(policy))) AS e;
    RETURN d;
END
$$;

CREATE OR REPLACE FUNCTION {{schema}}.enforce(key text, "limit" bigint, "window" text, algorithm text, cost bigint DEFAULT 1,
                                   timezone text DEFAULT NULL)
RETURNS {{schema}}.decision
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT SET plan_cache_mode = force_generic_plan
AS $$
DECLARE d {{schema}}.decision;
BEGIN
    SELECT e.* INTO d FROM pglimit_sql_adhoc_check(key, $2, $3, algorithm, cost, timezone) AS a,
                      pglimit_sql_enforced(a, 'the ad hoc key') AS e;
    RETURN d;
END
$$;

CREATE OR REPLACE FUNCTION {{schema}}.enforce(key text, "limit" bigint, "window" interval, algorithm text, cost bigint DEFAULT 1)
RETURNS {{schema}}.decision
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT SET plan_cache_mode = force_generic_plan
AS $$
DECLARE d {{schema}}.decision;
BEGIN
    SELECT e.* INTO d FROM pglimit_sql_adhoc_check(key, $2, $3, algorithm, cost) AS a,
                      pglimit_sql_enforced(a, 'the ad hoc key') AS e;
    RETURN d;
END
$$;

-- Puts the policy's buckets over `identifiers` (only those named in
-- `buckets`, if given) back to full, lifts their lockouts, and answers a
-- peek, as POST /reset does; every instance forgets its denials of them.
CREATE OR REPLACE FUNCTION {{schema}}.reset(policy text, identifiers jsonb, buckets text[] DEFAULT NULL)
RETURNS {{schema}}.decision
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT SET plan_cache_mode = force_generic_plan
AS $$
DECLARE d {{schema}}.decision;
BEGIN
    SELECT a.* INTO d FROM pglimit_sql_reset(policy, identifiers, $3) AS a;
    RETURN d;
END
$$;

-- Resets ad hoc key `key`, named as its check names it.
CREATE OR REPLACE FUNCTION {{schema}}.reset(key text, "limit" bigint, "window" text, algorithm text,
                                            timezone text DEFAULT NULL)
RETURNS {{schema}}.decision
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT SET plan_cache_mode = force_generic_plan
AS $$
DECLARE d {{schema}}.decision;
BEGIN
    SELECT a.* INTO d FROM pglimit_sql_adhoc_reset(key, $2, $3, algorithm, timezone) AS a;
    RETURN d;
END
$$;

-- Blocks the policy's buckets over `identifiers` (some of the policy's:
-- every bucket counting over only those, or the one named `bucket`) for
-- `duration`, as POST /admin/blocks does, audited as the calling role;
-- returns when the block ends. For an operator's role, not an application's.
CREATE OR REPLACE FUNCTION {{schema}}.block(policy text, identifiers jsonb, duration interval, reason text DEFAULT NULL,
                                            bucket text DEFAULT NULL) RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN (SELECT pglimit_sql_block(policy, identifiers, duration, reason, bucket));
END
$$;

-- Lifts the blocks block set; returns how many there were.
CREATE OR REPLACE FUNCTION {{schema}}.unblock(policy text, identifiers jsonb, bucket text DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN (SELECT pglimit_sql_unblock(policy, identifiers, bucket));
END
$$;

-- Frees a lease's slots: true if it held any, false if it was released
-- already or has ended, NULL if there is no such lease.
CREATE OR REPLACE FUNCTION {{schema}}.release(lease text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN (SELECT pglimit_sql_release(lease));
END
$$;

REVOKE ALL ON FUNCTION {{schema}}.check(text, jsonb, bigint), {{schema}}.check(text, bigint, text, text, bigint, text),
    {{schema}}.check(text, bigint, interval, text, bigint), {{schema}}.enforce(text, jsonb, bigint),
    {{schema}}.enforce(text, bigint, text, text, bigint, text), {{schema}}.enforce(text, bigint, interval, text, bigint),
    {{schema}}.reset(text, jsonb, text[]), {{schema}}.reset(text, bigint, text, text, text),
    {{schema}}.block(text, jsonb, interval, text, text), {{schema}}.unblock(text, jsonb, text), {{schema}}.release(text) FROM PUBLIC;
