-- An ad hoc key checked from SQL, as /check's ad hoc form decides it
-- (src/limiter/request.rs): one bucket named "default", keyed over the
-- key and the algorithm, its window in the API's text ("15m", "1 calendar
-- month") or as an interval. Refusals as in policies.sql.

-- The algorithm's code, or a refusal naming the field.
CREATE FUNCTION pglimit_sql_algorithm(name text) RETURNS smallint LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    CASE name
        WHEN 'fixed_window' THEN RETURN pglimit_fixed_window();
        WHEN 'sliding_window' THEN RETURN pglimit_sliding_window();
        WHEN 'sliding_log' THEN RETURN pglimit_sliding_log();
        WHEN 'token_bucket' THEN RETURN pglimit_token_bucket();
        WHEN 'concurrency' THEN RETURN pglimit_concurrency();
        ELSE PERFORM pglimit_sql_invalid('algorithm', format(
            'algorithm %s is not one of fixed_window, sliding_window, sliding_log, token_bucket, concurrency',
            to_json(name)));
    END CASE;
    RETURN NULL;
END
$$;

-- The largest limit of algorithm `algo` (Algorithm::max_limit).
CREATE FUNCTION pglimit_sql_max_limit(algo smallint) RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN algo IN (pglimit_sliding_log(), pglimit_concurrency()) THEN 1000 ELSE 1000000000 END;

-- A window in ms from the API's text: a whole number and a unit, from
-- 100ms to 366d (policy/duration.rs); a calendar window gives its nominal
-- length (1, 7 or 31 days) and its zone (UTC by default).
CREATE FUNCTION pglimit_sql_window(p_window text, p_timezone text, algo smallint, OUT window_ms bigint, OUT zone text)
LANGUAGE plpgsql STABLE AS $$
DECLARE m text[]; units constant jsonb := '{"ms": 1, "s": 1000, "m": 60000, "h": 3600000, "d": 86400000}';
BEGIN
    IF p_window IN ('1 calendar day', '1 calendar week', '1 calendar month') THEN
        IF algo <> pglimit_fixed_window() THEN
            PERFORM pglimit_sql_invalid('window', format(
                '%s is a calendar window, which only the fixed_window algorithm takes', to_json(p_window)));
        END IF;
        window_ms := CASE p_window WHEN '1 calendar day' THEN 86400000 WHEN '1 calendar week' THEN 604800000
                     ELSE 2678400000 END;
        zone := pglimit_sql_zone(coalesce(p_timezone, 'UTC'));
        RETURN;
    END IF;
    IF p_timezone IS NOT NULL THEN
        PERFORM pglimit_sql_invalid('timezone', format(
            'timezone goes only with a calendar window ("1 calendar day", "1 calendar week", "1 calendar month"); %s is not one',
            to_json(p_window)));
    END IF;
    m := regexp_match(p_window, '^([0-9]{1,15})(ms|s|m|h|d)$');
    IF m IS NULL THEN
        PERFORM pglimit_sql_invalid('window', format(
            '%s is not a duration: write a whole number and a unit (ms, s, m, h, d), e.g. "60s"', to_json(p_window)));
    END IF;
    window_ms := m[1]::bigint * (units ->> m[2])::bigint;
    PERFORM pglimit_sql_window_range(window_ms, to_json(p_window)::text);
END
$$;

CREATE FUNCTION pglimit_sql_window_range(window_ms bigint, shown text) RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF window_ms IS NULL OR window_ms < 100 OR window_ms > 366 * 86400000::bigint THEN
        PERFORM pglimit_sql_invalid('window', format('%s is out of range: a window must be between 100ms and 366d', shown));
    END IF;
END
$$;

-- An IANA region name the service takes (algorithm/calendar.rs: UTC or
-- Area/Location) and this server knows.
CREATE FUNCTION pglimit_sql_zone(name text) RETURNS text LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF NOT (name = 'UTC' OR (split_part(name, '/', 1) IN ('Africa', 'America', 'Antarctica', 'Arctic', 'Asia',
            'Atlantic', 'Australia', 'Europe', 'Indian', 'Pacific') AND split_part(name, '/', 2) <> ''))
       OR NOT EXISTS (SELECT 1 FROM pg_timezone_names WHERE pg_timezone_names.name = pglimit_sql_zone.name) THEN
        PERFORM pglimit_sql_invalid('timezone', format(
            'timezone %s is not an IANA region name this server knows: use Area/Location, such as "Europe/Berlin", or "UTC"',
            to_json(name)));
    END IF;
    RETURN name;
END
$$;

-- An ad hoc check of `p_key`: `p_limit` per `window_ms` (`zone`: a
-- calendar window's), by algorithm `p_algorithm`, taking `p_cost`.
CREATE FUNCTION pglimit_sql_adhoc(
    p_key text, p_limit bigint, window_ms bigint, zone text, algo smallint, p_algorithm text, p_cost bigint,
    p_now timestamptz
) RETURNS SETOF pglimit_sql_answer LANGUAGE plpgsql AS $$
DECLARE pads record; max_limit bigint := pglimit_sql_max_limit(algo);
BEGIN
    PERFORM pglimit_sql_refused_on_citus();
    PERFORM pglimit_sql_cost_range(p_cost);
    IF p_key IS NULL OR octet_length(p_key) NOT BETWEEN 1 AND 256 THEN
        PERFORM pglimit_sql_invalid('key', 'key must be 1 to 256 bytes');
    END IF;
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > max_limit THEN
        PERFORM pglimit_sql_invalid('limit', format('limit must be between 1 and %s', max_limit));
    END IF;
    IF algo = pglimit_concurrency() AND window_ms > 86400000 THEN
        PERFORM pglimit_sql_invalid('window', 'lease must be at most 1d, the max_lease_life of ad hoc leases');
    END IF;
    PERFORM pglimit_sql_cost_fits(p_cost, p_limit, 'default');
    pads := pglimit_sql_pads();
    RETURN QUERY SELECT * FROM pglimit_sql_decide(
        '_adhoc', ARRAY['default'], ARRAY[p_algorithm], ARRAY[pglimit_adhoc_key(pads.inner_pad, pads.outer_pad, p_key, p_algorithm)],
        ARRAY[p_limit], ARRAY[window_ms], ARRAY[algo], ARRAY[0::bigint], ARRAY[zone], ARRAY[86400000::bigint],
        ARRAY[NULL::jsonb], p_cost, NULL, NULL, false, coalesce(p_now, now()));
END
$$;

-- The ad hoc check with its window as the API writes it.
CREATE FUNCTION pglimit_sql_adhoc_check(
    p_key text, p_limit bigint, p_window text, p_algorithm text, p_cost bigint, p_timezone text,
    p_now timestamptz DEFAULT NULL
) RETURNS SETOF pglimit_sql_answer LANGUAGE plpgsql AS $$
DECLARE algo smallint := pglimit_sql_algorithm(p_algorithm); w record;
BEGIN
    w := pglimit_sql_window(p_window, p_timezone, algo);
    RETURN QUERY SELECT * FROM pglimit_sql_adhoc(p_key, p_limit, w.window_ms, w.zone, algo, p_algorithm, p_cost, p_now);
END
$$;

-- The ad hoc check with its window as an interval: days of 24 hours, no
-- months (a calendar month is written "1 calendar month").
CREATE FUNCTION pglimit_sql_adhoc_check(
    p_key text, p_limit bigint, p_window interval, p_algorithm text, p_cost bigint,
    p_now timestamptz DEFAULT NULL
) RETURNS SETOF pglimit_sql_answer LANGUAGE plpgsql AS $$
DECLARE algo smallint := pglimit_sql_algorithm(p_algorithm); ms numeric;
BEGIN
    IF extract(month FROM p_window) <> 0 OR extract(year FROM p_window) <> 0 THEN
        PERFORM pglimit_sql_invalid('window', format(
            'interval %s has months, whose length varies: write days, or the text "1 calendar month"', p_window));
    END IF;
    ms := extract(epoch FROM p_window) * 1000;
    IF ms <> trunc(ms) THEN
        PERFORM pglimit_sql_invalid('window', format('interval %s is not a whole number of milliseconds', p_window));
    END IF;
    PERFORM pglimit_sql_window_range(ms::bigint, format('interval %s', p_window));
    RETURN QUERY SELECT * FROM pglimit_sql_adhoc(p_key, p_limit, ms::bigint, NULL, algo, p_algorithm, p_cost, p_now);
END
$$;
