-- One row per bucket. The key is HMAC-SHA256 of (policy, bucket, normalised
-- identifiers), so no raw identifier is ever stored.
CREATE TABLE pglimit_buckets (
    key      bytea       PRIMARY KEY CHECK (octet_length(key) = 32),
    count    bigint      NOT NULL CHECK (count >= 0),
    reset_at timestamptz NOT NULL
) WITH (fillfactor = 70);
-- fillfactor leaves room on each page so that counter updates (which touch no
-- indexed column) stay HOT updates.

-- Serves the cleanup, which deletes the oldest expired rows first.
CREATE INDEX pglimit_buckets_reset_at ON pglimit_buckets (reset_at);

-- Decides one check of any number of fixed-window buckets, all or nothing.
--
-- Invariant: for every bucket, `count` is the cost admitted since the window
-- started, and a window that has reached `reset_at` counts as empty. A check is
-- admitted only if, for every bucket, count + cost <= limit; then every bucket
-- takes the cost. Otherwise no bucket changes (a denied check consumes
-- nothing). `now()` is the only clock.
--
-- Rows are locked in key order (creating missing ones first), so two checks
-- that share buckets always lock them in the same order and cannot deadlock,
-- and no concurrent check can read a count between our read and our write.
CREATE FUNCTION pglimit_check(
    p_keys       bytea[],
    p_limits     bigint[],
    p_windows_ms bigint[],
    p_cost       bigint
) RETURNS TABLE (
    o_idx      integer,
    o_allowed  boolean,
    o_count    bigint,
    o_reset_at timestamptz,
    o_now      timestamptz
) LANGUAGE plpgsql AS $$
DECLARE
    v_all boolean;
BEGIN
    -- DO UPDATE ... WHERE false writes nothing but still locks an existing row.
    -- A new row starts expired, so only an admitted check starts its window
    -- (a peek with cost 0, or a denied check, must not).
    INSERT INTO pglimit_buckets AS b (key, count, reset_at)
    SELECT u.key, 0, now()
    FROM unnest(p_keys) AS u(key)
    ORDER BY u.key
    ON CONFLICT (key) DO UPDATE SET count = b.count WHERE false;

    SELECT bool_and(
               CASE WHEN b.reset_at <= now() THEN 0 ELSE b.count END + p_cost <= u.lim)
    INTO v_all
    FROM unnest(p_keys, p_limits) AS u(key, lim)
    JOIN pglimit_buckets b ON b.key = u.key;

    IF v_all AND p_cost > 0 THEN
        RETURN QUERY
        UPDATE pglimit_buckets b SET
            count    = CASE WHEN b.reset_at <= now() THEN 0 ELSE b.count END + p_cost,
            reset_at = CASE WHEN b.reset_at <= now()
                            THEN now() + u.win * interval '1 millisecond'
                            ELSE b.reset_at END
        FROM unnest(p_keys, p_windows_ms) WITH ORDINALITY AS u(key, win, idx)
        WHERE b.key = u.key
        RETURNING u.idx::integer, true, b.count, b.reset_at, now();
    ELSE
        RETURN QUERY
        SELECT u.idx::integer,
               e.count + p_cost <= u.lim,
               e.count,
               e.reset_at,
               now()
        FROM unnest(p_keys, p_limits, p_windows_ms) WITH ORDINALITY AS u(key, lim, win, idx)
        JOIN pglimit_buckets b ON b.key = u.key
        CROSS JOIN LATERAL (
            SELECT CASE WHEN b.reset_at <= now() THEN 0 ELSE b.count END AS count,
                   CASE WHEN b.reset_at <= now()
                        THEN now() + u.win * interval '1 millisecond'
                        ELSE b.reset_at END AS reset_at
        ) e;
    END IF;
END
$$;
