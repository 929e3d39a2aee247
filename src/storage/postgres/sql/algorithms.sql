-- Each algorithm's arithmetic, once, as SQL functions of one expression
-- that the planner inlines into the statements calling them; and
-- pglimit_decide, one bucket's whole decision built from them. The Rust
-- model (src/algorithm/) is the other place this arithmetic is written; a
-- test replays random traces through every statement and the model.
--
-- Times are integer microseconds since the epoch; `win` is a window in µs.
-- A state read from a missing row is all NULL, which every function below
-- takes as an empty bucket.

-- Through an interval, whose extract is immutable (a timestamptz's is only
-- stable), so that the planner inlines it and Citus sends it to the shards.
CREATE FUNCTION pglimit_us(ts timestamptz) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN (extract(epoch FROM ts - timestamptz 'epoch') * 1000000)::bigint;

CREATE FUNCTION pglimit_ts(us bigint) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN timestamptz 'epoch' + us * interval '1 microsecond';

-- Where a statement has times as timestamptz rather than µs, a function
-- takes them as `anyelement` (and so has a quoted body, as SQL requires of
-- polymorphic functions): the same comparison serves both. Each
-- argument that may be an expression appears once in a body, or the
-- planner would not inline the call.

-- Fixed window: a count until the window ends (s_expires); the first check
-- after that starts a new window, ending at `new_end`.
CREATE FUNCTION pglimit_fixed_count(s_count bigint, s_expires anyelement, now anyelement) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT CASE WHEN s_expires > now THEN s_count ELSE 0 END $$;

CREATE FUNCTION pglimit_fixed_end(s_expires anyelement, now anyelement, new_end anyelement) RETURNS anyelement
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT CASE WHEN s_expires > now THEN s_expires ELSE new_end END $$;

-- A calendar window (a fixed window's, src/algorithm/calendar.rs) ends at
-- the next local midnight, Monday (ISO week) or 1st of the month in zone
-- `tz`, after the instant `now_us`. It travels as its unit's nominal length
-- in `win` (1, 7 or 31 days) and its IANA zone in `tz`. A local midnight
-- a clock change skips or repeats is read as Postgres reads any local time
-- (the offset from before a skip, from after a repeat); the model agrees.
CREATE FUNCTION pglimit_calendar_end(now_us bigint, win bigint, tz text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN pglimit_us(CASE win WHEN 86400000000 THEN date_trunc('day', pglimit_ts(now_us) AT TIME ZONE tz) + interval '1 day'
                           WHEN 604800000000 THEN date_trunc('week', pglimit_ts(now_us) AT TIME ZONE tz) + interval '1 week'
                           ELSE date_trunc('month', pglimit_ts(now_us) AT TIME ZONE tz) + interval '1 month'
                  END AT TIME ZONE tz);

-- Where a new fixed window that starts now ends: `win` later, or, for a
-- calendar window (a zone given), at the next calendar boundary.
CREATE FUNCTION pglimit_window_end(now_us bigint, win bigint, tz text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN tz IS NULL THEN now_us + win ELSE pglimit_calendar_end(now_us, win, tz) END;

-- Sliding window counter: windows aligned on the clock; a row keeps its
-- window's count and the previous window's, and is stamped with the end of
-- its window plus one window: `row_end` for a row of the current window,
-- `prev_end` for one of the previous window.
CREATE FUNCTION pglimit_sliding_start(now_us bigint, win bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN now_us / win * win;

-- The count of the current window, as the row gives it.
CREATE FUNCTION pglimit_sliding_current(s_count bigint, s_expires anyelement, row_end anyelement) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT CASE WHEN s_expires = row_end THEN s_count ELSE 0 END $$;

-- The count of the previous window, as the row gives it.
CREATE FUNCTION pglimit_sliding_previous(
    s_count bigint, s_prev bigint, s_expires anyelement, row_end anyelement, prev_end anyelement
) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT CASE WHEN s_expires = row_end THEN s_prev WHEN s_expires = prev_end THEN s_count ELSE 0 END $$;

-- What the previous window still weighs now: its count times the share of
-- it the sliding window still covers, rounded down.
CREATE FUNCTION pglimit_sliding_weight(prev bigint, win bigint, now_us bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN div(prev::numeric * (win - now_us % win), win)::bigint;

-- Smallest elapsed time e (µs into a window) with
-- floor(prev * (win - e) / win) <= need.
CREATE FUNCTION pglimit_sliding_earliest(win bigint, prev bigint, need bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN greatest(win - ceil((need + 1)::numeric * win / greatest(prev, 1))::bigint + 1, 0);

-- When a denied check of `cost` fits: later in this window if its own
-- count leaves room, else in the next one.
CREATE FUNCTION pglimit_sliding_retry(
    lim bigint, win bigint, start_us bigint, c bigint, p bigint, cost bigint
) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN c + cost <= lim THEN start_us + pglimit_sliding_earliest(win, p, lim - c - cost)
            ELSE start_us + win + pglimit_sliding_earliest(win, c, greatest(lim - cost, 0)) END;

-- Sliding log: one timestamp per admitted unit; an entry counts while it
-- is within the last window. (A function of the whole log would not
-- inline, and one of a set would take the clock as an expression computed
-- for every entry.)
CREATE FUNCTION pglimit_log_keeps(entry bigint, now_us bigint, win bigint) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN entry > now_us - win;

-- Token bucket (GCRA): a theoretical arrival time (tat) that each admitted
-- unit moves one step on; a check fits while it stays within the capacity
-- (step * limit) of now.
CREATE FUNCTION pglimit_token_step(win bigint, lim bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN greatest(win / greatest(lim, 1), 1);

-- A missing tat (greatest ignores NULL) or one in the past counts from now.
CREATE FUNCTION pglimit_token_tat(s_tat bigint, now_us bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN greatest(s_tat, now_us);

-- Whether a check that moves the tat by `taken` (cost * step) fits a
-- bucket of capacity `cap` (step * limit).
CREATE FUNCTION pglimit_token_fits(tat bigint, taken bigint, cap bigint, now_us bigint) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN tat + taken - now_us <= cap;

-- Concurrency: one lease expiry per held slot; a slot is held while its
-- lease has not ended (releasing and renewing: leases.sql).
CREATE FUNCTION pglimit_lease_holds(entry bigint, now_us bigint) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN entry > now_us;

-- One bucket's decision, as src/algorithm/ decides it. The codes are
-- Algorithm::code: 0 fixed window, 1 sliding window counter, 2 sliding log,
-- 3 token bucket, 4 concurrency (win: the lease time); any other raises.
-- `admit`: whether the next state counts this check (its other buckets fit
-- too). `tz`: a calendar window's zone (fixed windows only; NULL for every
-- other window).
CREATE FUNCTION pglimit_decide(
    algo smallint, s_count bigint, s_prev bigint, s_expires bigint, s_tat bigint, s_log bigint[],
    lim bigint, win bigint, cost bigint, now_us bigint, admit boolean, tz text DEFAULT NULL,
    OUT allowed boolean, OUT remaining bigint, OUT full_us bigint, OUT retry_us bigint,
    OUT n_count bigint, OUT n_prev bigint, OUT n_expires bigint, OUT n_tat bigint, OUT n_log bigint[]
) LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    c bigint; p bigint; w bigint; start_us bigint; end_us bigint;
    entries bigint[]; step bigint; tat bigint;
BEGIN
    n_count := 0; n_prev := 0; n_tat := NULL; n_log := NULL;
    IF tz IS NOT NULL AND algo <> 0 THEN
        RAISE EXCEPTION 'pglimit_decide: a calendar window (zone %) with algorithm code %', tz, algo;
    END IF;
    IF algo = 0 THEN
        c := pglimit_fixed_count(s_count, s_expires, now_us);
        end_us := pglimit_fixed_end(s_expires, now_us, pglimit_window_end(now_us, win, tz));
        allowed := c + cost <= lim;
        IF admit THEN c := c + cost; END IF;
        remaining := greatest(lim - c, 0);
        full_us := end_us;
        retry_us := CASE WHEN allowed THEN NULL ELSE end_us END;
        n_count := c; n_expires := end_us;
    ELSIF algo = 1 THEN
        start_us := pglimit_sliding_start(now_us, win);
        end_us := start_us + win;
        c := pglimit_sliding_current(s_count, s_expires, end_us + win);
        p := pglimit_sliding_previous(s_count, s_prev, s_expires, end_us + win, end_us);
        w := pglimit_sliding_weight(p, win, now_us);
        allowed := w + c + cost <= lim;
        IF admit THEN c := c + cost; END IF;
        remaining := greatest(lim - w - c, 0);
        full_us := CASE WHEN c > 0 THEN end_us + win WHEN p > 0 THEN end_us ELSE now_us END;
        IF NOT allowed THEN
            retry_us := pglimit_sliding_retry(lim, win, start_us, c, p, cost);
        END IF;
        n_count := c; n_prev := p; n_expires := end_us + win;
    ELSIF algo = 2 THEN
        entries := ARRAY(SELECT x FROM unnest(coalesce(s_log, '{}')) AS x WHERE pglimit_log_keeps(x, now_us, win) ORDER BY x);
        allowed := cardinality(entries) + cost <= lim;
        IF NOT allowed THEN
            retry_us := coalesce(entries[cardinality(entries) + cost - lim] + win, now_us);
        END IF;
        IF admit THEN entries := entries || array_fill(now_us, ARRAY[cost::int]); END IF;
        full_us := coalesce(entries[cardinality(entries)] + win, now_us);
        remaining := greatest(lim - cardinality(entries), 0);
        n_log := entries; n_expires := full_us;
    ELSIF algo = 3 THEN
        step := pglimit_token_step(win, lim);
        tat := pglimit_token_tat(s_tat, now_us);
        allowed := pglimit_token_fits(tat, cost * step, step * lim, now_us);
        retry_us := CASE WHEN allowed THEN NULL ELSE tat + cost * step - step * lim END;
        IF admit THEN tat := tat + cost * step; END IF;
        remaining := greatest((now_us + step * lim - tat) / step, 0);
        full_us := tat;
        n_tat := tat; n_expires := tat;
    ELSIF algo = 4 THEN
        entries := ARRAY(SELECT x FROM unnest(coalesce(s_log, '{}')) AS x WHERE pglimit_lease_holds(x, now_us) ORDER BY x);
        allowed := cardinality(entries) + cost <= lim;
        IF NOT allowed THEN
            retry_us := coalesce(entries[cardinality(entries) + cost - lim], now_us);
        END IF;
        IF admit THEN
            entries := ARRAY(SELECT x FROM unnest(entries || array_fill(now_us + win, ARRAY[cost::int])) AS x ORDER BY x);
        END IF;
        full_us := coalesce(entries[cardinality(entries)], now_us);
        remaining := greatest(lim - cardinality(entries), 0);
        n_log := entries; n_expires := full_us;
    ELSE
        RAISE EXCEPTION 'pglimit_decide: unknown algorithm code %', algo;
    END IF;
END
$$;
