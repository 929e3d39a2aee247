-- The sliding window counter's arithmetic (pglimit_decide, algo 1) as
-- expressions the planner inlines, for the conflict branch of the service's
-- plain upsert, which decides a one-bucket sliding window check on the row
-- it has locked. A row of the current window ends at new_exp (one window
-- after the current one); a row of the previous window, one window before.

-- The previous window's count, as the locked row gives it.
CREATE FUNCTION pglimit_sliding_prev(
    b_count bigint, b_prev bigint, b_exp timestamptz, new_exp timestamptz, win_us bigint
) RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE
RETURN CASE WHEN b_exp = new_exp THEN b_prev
            WHEN b_exp = new_exp - win_us * interval '1 microsecond' THEN b_count
            ELSE 0 END;

-- What the previous window still weighs now: its count times the share of
-- it the sliding window still covers, rounded down.
CREATE FUNCTION pglimit_sliding_weight(prev bigint, win_us bigint, now_us bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN div(prev::numeric * (win_us - now_us % win_us), win_us)::bigint;
