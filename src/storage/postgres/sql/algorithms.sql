-- Each algorithm's arithmetic, once, as SQL functions of one expression
-- that the planner inlines into the statements calling them; and
-- pglimit_decide, one bucket's whole decision built from them. The Rust
-- model (src/algorithm/) is the other place this arithmetic is written; a
-- test replays random traces through every statement and the model.
--
-- Times are integer microseconds since the epoch; `win` is a window in µs.
-- A state read from a missing row is all NULL, which every function below
-- takes as an empty bucket.

-- The algorithms' codes (Algorithm::code), by name: constants the planner
-- folds, so that a statement reads `algo = pglimit_token_bucket()`.
CREATE FUNCTION pglimit_fixed_window() RETURNS smallint LANGUAGE sql IMMUTABLE PARALLEL SAFE RETURN 0;
CREATE FUNCTION pglimit_sliding_window() RETURNS smallint LANGUAGE sql IMMUTABLE PARALLEL SAFE RETURN 1;
CREATE FUNCTION pglimit_sliding_log() RETURNS smallint LANGUAGE sql IMMUTABLE PARALLEL SAFE RETURN 2;
CREATE FUNCTION pglimit_token_bucket() RETURNS smallint LANGUAGE sql IMMUTABLE PARALLEL SAFE RETURN 3;
CREATE FUNCTION pglimit_concurrency() RETURNS smallint LANGUAGE sql IMMUTABLE PARALLEL SAFE RETURN 4;

-- Whether a check of `cost` fits beside `used` of `lim`, and what is left
-- of `lim` after `used`: every counting algorithm's (fixed and sliding
-- windows, sliding log, concurrency).
CREATE FUNCTION pglimit_fits(used bigint, cost bigint, lim bigint) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN used + cost <= lim;

CREATE FUNCTION pglimit_room(lim bigint, used bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN greatest(lim - used, 0);

-- Through an interval, whose extract is immutable (a timestamptz's is only
-- stable), so that the planner inlines it and Citus sends it to the shards.
CREATE FUNCTION pglimit_us(ts timestamptz) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN (extract(epoch FROM ts - timestamptz 'epoch') * 1000000)::bigint;

-- And back, through a timestamp (timestamptz + interval is only stable,
-- and a function whose body is less immutable than it says is not inlined).
CREATE FUNCTION pglimit_ts(us bigint) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN (timestamp 'epoch' + us * interval '1 microsecond') AT TIME ZONE 'UTC';

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

-- How many of `n` alike checks of `cost` fit in `room`, in arrival order:
-- a hot key's checks proposed as one row (hot_upsert.sql).
CREATE FUNCTION pglimit_fixed_takes(n bigint, room bigint, cost bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN least(n, room / cost);

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

-- Where a row of the current window ends: its window's end plus one
-- window (`row_end` below; a row of the previous window ends one window
-- earlier, `prev_end`).
CREATE FUNCTION pglimit_sliding_row_end(now_us bigint, win bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN pglimit_sliding_start(now_us, win) + 2 * win;

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

-- When the bucket is full again, with `c` counted in the current window
-- and `p` in the previous one: when the window that holds the last of
-- them has slid past.
CREATE FUNCTION pglimit_sliding_full(c bigint, p bigint, now_us bigint, win bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN c > 0 THEN pglimit_sliding_row_end(now_us, win)
            WHEN p > 0 THEN pglimit_sliding_row_end(now_us, win) - win
            ELSE now_us END;

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

-- The entries of `log` still in the window, oldest first. A function with
-- a subquery is not inlined, so the set-based statements write this
-- ARRAY(...) out around pglimit_log_keeps (and pglimit_lease_holds below)
-- rather than call it for every row.
CREATE FUNCTION pglimit_log_live(log bigint[], now_us bigint, win bigint) RETURNS bigint[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN ARRAY(SELECT x FROM unnest(coalesce(log, '{}')) AS x WHERE pglimit_log_keeps(x, now_us, win) ORDER BY x);

-- A denied check of `cost` fits once enough of the oldest `entries` have
-- left the window; `win` 0 where an entry is its own end (a lease's).
CREATE FUNCTION pglimit_log_retry(entries bigint[], cost bigint, lim bigint, win bigint, now_us bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN coalesce(entries[cardinality(entries) + cost - lim] + win, now_us);

-- The log is empty again once its newest entry has left the window.
CREATE FUNCTION pglimit_log_full(entries bigint[], win bigint, now_us bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN coalesce(entries[cardinality(entries)] + win, now_us);

-- An admitted check's entries: one per unit of its cost, stamped now.
CREATE FUNCTION pglimit_log_take(entries bigint[], cost bigint, now_us bigint) RETURNS bigint[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN entries || array_fill(now_us, ARRAY[cost::integer]);

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

-- What is left: how many steps the tat is short of now + capacity.
CREATE FUNCTION pglimit_token_remaining(tat bigint, step bigint, lim bigint, now_us bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN greatest((now_us + step * lim - tat) / step, 0);

-- A denied check of `cost` fits once the tat it would leave is within the
-- capacity of the clock.
CREATE FUNCTION pglimit_token_retry(tat bigint, cost bigint, step bigint, lim bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN tat + cost * step - step * lim;

-- Concurrency: one lease expiry per held slot; a slot is held while its
-- lease has not ended (releasing and renewing: leases.sql).
CREATE FUNCTION pglimit_lease_holds(entry bigint, now_us bigint) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN entry > now_us;

-- The leases of `log` still held, soonest ending first. A lease's entry is
-- its end, so the log's retry and full time serve with no window.
CREATE FUNCTION pglimit_leases_held(log bigint[], now_us bigint) RETURNS bigint[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN ARRAY(SELECT x FROM unnest(coalesce(log, '{}')) AS x WHERE pglimit_lease_holds(x, now_us) ORDER BY x);

-- An admitted check's leases: one per unit of its cost, each ending at
-- `ends_us`, kept in order of their end.
CREATE FUNCTION pglimit_lease_take(entries bigint[], cost bigint, ends_us bigint) RETURNS bigint[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN ARRAY(SELECT x FROM unnest(entries || array_fill(ends_us, ARRAY[cost::integer])) AS x ORDER BY x);

-- One bucket's decision, as src/algorithm/ decides it, composed of the
-- functions above; any algorithm code but the five raises. `admit`:
-- whether the next state counts this check (its other buckets fit too).
-- `tz`: a calendar window's zone (fixed windows only; NULL for every other
-- window). For a concurrency bucket `win` is the lease time.
CREATE FUNCTION pglimit_decide(
    algo smallint, s_count bigint, s_prev bigint, s_expires bigint, s_tat bigint, s_log bigint[],
    lim bigint, win bigint, cost bigint, now_us bigint, admit boolean, tz text DEFAULT NULL,
    OUT allowed boolean, OUT remaining bigint, OUT full_us bigint, OUT retry_us bigint,
    OUT n_count bigint, OUT n_prev bigint, OUT n_expires bigint, OUT n_tat bigint, OUT n_log bigint[]
) LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    c bigint; p bigint; w bigint; end_us bigint; entries bigint[]; step bigint; tat bigint;
BEGIN
    n_count := 0; n_prev := 0; n_tat := NULL; n_log := NULL;
    IF tz IS NOT NULL AND algo <> pglimit_fixed_window() THEN
        RAISE EXCEPTION 'pglimit_decide: a calendar window (zone %) with algorithm code %', tz, algo;
    END IF;
    IF algo = pglimit_fixed_window() THEN
        c := pglimit_fixed_count(s_count, s_expires, now_us);
        end_us := pglimit_fixed_end(s_expires, now_us, pglimit_window_end(now_us, win, tz));
        allowed := pglimit_fits(c, cost, lim);
        IF admit THEN c := c + cost; END IF;
        remaining := pglimit_room(lim, c);
        full_us := end_us;
        retry_us := CASE WHEN allowed THEN NULL ELSE end_us END;
        n_count := c; n_expires := end_us;
    ELSIF algo = pglimit_sliding_window() THEN
        end_us := pglimit_sliding_row_end(now_us, win);
        c := pglimit_sliding_current(s_count, s_expires, end_us);
        p := pglimit_sliding_previous(s_count, s_prev, s_expires, end_us, end_us - win);
        w := pglimit_sliding_weight(p, win, now_us);
        allowed := pglimit_fits(w + c, cost, lim);
        IF admit THEN c := c + cost; END IF;
        remaining := pglimit_room(lim, w + c);
        full_us := pglimit_sliding_full(c, p, now_us, win);
        IF NOT allowed THEN
            retry_us := pglimit_sliding_retry(lim, win, pglimit_sliding_start(now_us, win), c, p, cost);
        END IF;
        n_count := c; n_prev := p; n_expires := end_us;
    ELSIF algo = pglimit_sliding_log() THEN
        entries := pglimit_log_live(s_log, now_us, win);
        allowed := pglimit_fits(cardinality(entries), cost, lim);
        IF NOT allowed THEN
            retry_us := pglimit_log_retry(entries, cost, lim, win, now_us);
        END IF;
        IF admit THEN entries := pglimit_log_take(entries, cost, now_us); END IF;
        full_us := pglimit_log_full(entries, win, now_us);
        remaining := pglimit_room(lim, cardinality(entries));
        n_log := entries; n_expires := full_us;
    ELSIF algo = pglimit_token_bucket() THEN
        step := pglimit_token_step(win, lim);
        tat := pglimit_token_tat(s_tat, now_us);
        allowed := pglimit_token_fits(tat, cost * step, step * lim, now_us);
        retry_us := CASE WHEN allowed THEN NULL ELSE pglimit_token_retry(tat, cost, step, lim) END;
        IF admit THEN tat := tat + cost * step; END IF;
        remaining := pglimit_token_remaining(tat, step, lim, now_us);
        full_us := tat;
        n_tat := tat; n_expires := tat;
    ELSIF algo = pglimit_concurrency() THEN
        entries := pglimit_leases_held(s_log, now_us);
        allowed := pglimit_fits(cardinality(entries), cost, lim);
        IF NOT allowed THEN
            retry_us := pglimit_log_retry(entries, cost, lim, 0, now_us);
        END IF;
        IF admit THEN entries := pglimit_lease_take(entries, cost, now_us + win); END IF;
        full_us := pglimit_log_full(entries, 0, now_us);
        remaining := pglimit_room(lim, cardinality(entries));
        n_log := entries; n_expires := full_us;
    ELSE
        RAISE EXCEPTION 'pglimit_decide: unknown algorithm code %', algo;
    END IF;
END
$$;
