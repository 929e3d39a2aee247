-- Concurrency buckets' leases: taking them (in the check's own statement),
-- releasing and renewing them, and ending them on a reset. A bucket's row
-- holds one expiry per held slot (algorithms.sql, pglimit_decide's algo
-- 4); a lease's row in pglimit_leases says which expiry, and how many
-- slots, in which rows, and how long renewals may keep it (ends_by).
-- Entries with the same expiry are interchangeable, so removing `slots` of
-- them frees exactly this lease's slots whichever lease put them there.
--
-- Releasing, renewing and ending lock the bucket rows first, in key order,
-- as checks do (which then only insert lease rows of a new id): no deadlock.

-- `entries` without `n` of the entries equal to `expiry`.
CREATE FUNCTION pglimit_lease_drop(entries bigint[], expiry bigint, n bigint) RETURNS bigint[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN ARRAY(
    SELECT s.x FROM (SELECT u.x, row_number() OVER (PARTITION BY u.x) AS i
                     FROM unnest(coalesce(entries, '{}')) AS u(x)) AS s
    WHERE s.x <> expiry OR s.i > n ORDER BY s.x);

-- The latest a lease taken at `now_us` may be renewed to: `life_ms` later
-- (its policy's max_lease_life), 1 day where none is given.
CREATE FUNCTION pglimit_lease_ends_by(now_us bigint, life_ms bigint) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN pglimit_ts(now_us + coalesce(nullif(life_ms, 0), 86400000) * 1000);

-- The lease rows of a batch's admitted checks: one per concurrency bucket
-- of a check given a lease id (p_leases, per bucket), ending as the
-- bucket's new entries do, and renewable up to its check's max_lease_life
-- (p_lives, ms per bucket; 1 day where not given).
CREATE FUNCTION pglimit_take_leases(
    p_checks integer[], p_keys bytea[], p_windows_ms bigint[], p_algos smallint[], p_costs bigint[],
    p_leases bytea[], a_allowed boolean[], v_now timestamptz, p_lives bigint[] DEFAULT NULL
) RETURNS void LANGUAGE sql AS $$
    INSERT INTO pglimit_leases (id, key, slots, lease_us, expires_at, ends_by)
    SELECT r.id, r.key, r.cost, r.win * 1000, pglimit_ts(pglimit_us(v_now) + r.win * 1000),
           pglimit_lease_ends_by(pglimit_us(v_now), r.life)
    FROM (SELECT u.*, bool_and(u.al) OVER (PARTITION BY u.chk) AS admit
          FROM unnest(p_checks, p_keys, p_windows_ms, p_algos, p_costs, p_leases, a_allowed, p_lives)
               AS u(chk, key, win, algo, cost, id, al, life)) AS r
    WHERE r.admit AND r.cost > 0 AND r.algo = pglimit_concurrency() AND octet_length(r.id) = 32
    ORDER BY r.id, r.key
    ON CONFLICT DO NOTHING
$$;

-- Locks the rows of the buckets lease `p_id` holds slots in, in key order.
CREATE FUNCTION pglimit_lock_lease(p_id bytea) RETURNS void LANGUAGE sql AS $$
    SELECT 1 FROM pglimit_buckets b
    WHERE b.key IN (SELECT l.key FROM pglimit_leases l WHERE l.id = p_id) ORDER BY b.key FOR UPDATE
$$;

-- Frees lease `p_id`'s slots: true if it held any, false if it was
-- released already or has ended, NULL if there is no such lease (or it
-- ended and was cleaned up, or a reset ended it). Notifies pglimit_actions
-- with `released <hex key>,...`: the listener forgets denials of those
-- keys, and a waiter may take the slot. The row is kept a minute more,
-- ended, so that a retried release still answers false; then the cleanup
-- deletes it as any ended lease.
CREATE FUNCTION pglimit_release(p_id bytea) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    now_us bigint := pglimit_us(now()); r record; found_any boolean := false; freed text[] := '{}';
BEGIN
    PERFORM pglimit_lock_lease(p_id);
    FOR r IN SELECT l.key, l.slots, pglimit_us(l.expires_at) AS exp_us, l.released
             FROM pglimit_leases l WHERE l.id = p_id ORDER BY l.key FOR UPDATE LOOP
        found_any := true;
        CONTINUE WHEN r.released OR r.exp_us <= now_us;
        UPDATE pglimit_buckets SET log = pglimit_lease_drop(log, r.exp_us, r.slots) WHERE key = r.key;
        freed := freed || encode(r.key, 'hex');
    END LOOP;
    IF NOT found_any THEN
        RETURN NULL;
    END IF;
    UPDATE pglimit_leases SET released = true, expires_at = least(expires_at, now() + interval '1 minute')
    WHERE id = p_id AND NOT released;
    IF cardinality(freed) > 0 THEN
        PERFORM pg_notify('pglimit_actions', 'released ' || array_to_string(freed, ','));
    END IF;
    RETURN cardinality(freed) > 0;
END
$$;

-- Extends lease `p_id` by each bucket's lease time from now. `o_ends`: when
-- it ends now (the earliest of its buckets), NULL if it has ended, was
-- released, or does not exist. A renewal that would take it past `o_ends_by`
-- (its max_lease_life) changes nothing and answers `o_renewed` false. Only
-- the slots still in a row are moved: one a reset freed stays free.
CREATE FUNCTION pglimit_renew(
    p_id bytea, OUT o_ends timestamptz, OUT o_ends_by timestamptz, OUT o_renewed boolean
) LANGUAGE plpgsql AS $$
DECLARE
    now_us bigint := pglimit_us(now()); r record; ends bigint; entries bigint[]; kept bigint[]; n integer;
    past boolean;
BEGIN
    PERFORM pglimit_lock_lease(p_id);
    SELECT min(l.expires_at), min(l.ends_by), bool_or(now_us + l.lease_us > pglimit_us(l.ends_by))
    INTO o_ends, o_ends_by, past
    FROM pglimit_leases l WHERE l.id = p_id AND NOT l.released AND l.expires_at > now();
    o_renewed := false;
    IF o_ends IS NULL OR past THEN
        RETURN;
    END IF;
    FOR r IN SELECT l.key, l.slots, l.lease_us, pglimit_us(l.expires_at) AS exp_us
             FROM pglimit_leases l
             WHERE l.id = p_id AND NOT l.released AND l.expires_at > now() ORDER BY l.key FOR UPDATE LOOP
        SELECT b.log INTO entries FROM pglimit_buckets b WHERE b.key = r.key;
        kept := pglimit_lease_drop(entries, r.exp_us, r.slots);
        n := coalesce(cardinality(entries), 0) - cardinality(kept);
        IF n > 0 THEN
            UPDATE pglimit_buckets SET
                log = ARRAY(SELECT x FROM unnest(kept || array_fill(now_us + r.lease_us, ARRAY[n])) AS x ORDER BY x),
                expires_at = greatest(expires_at, pglimit_ts(now_us + r.lease_us))
            WHERE key = r.key;
        END IF;
        UPDATE pglimit_leases SET expires_at = pglimit_ts(now_us + r.lease_us) WHERE id = p_id AND key = r.key;
        ends := least(ends, now_us + r.lease_us);
    END LOOP;
    o_ends := pglimit_ts(ends);
    o_renewed := true;
END
$$;

-- A reset of `p_keys` ends every lease holding slots in them: its slots in
-- other buckets are freed as a release frees them, and its rows deleted, so
-- that a later release or renewal is told there is no such lease. Rows are
-- locked in key order, as checks lock them. A lease taken on one of
-- `p_keys` while this waited for those locks is ended too, but its slots
-- elsewhere are left to end by themselves (their rows were not locked).
CREATE FUNCTION pglimit_end_leases(p_keys bytea[]) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    ids bytea[]; r record; freed text[] := '{}';
BEGIN
    ids := ARRAY(SELECT DISTINCT l.id FROM pglimit_leases l WHERE l.key = ANY (p_keys));
    IF cardinality(ids) = 0 THEN
        RETURN;
    END IF;
    PERFORM 1 FROM pglimit_buckets b
    WHERE b.key = ANY (p_keys) OR b.key IN (SELECT l.key FROM pglimit_leases l WHERE l.id = ANY (ids))
    ORDER BY b.key FOR UPDATE;
    FOR r IN SELECT l.key, l.slots, pglimit_us(l.expires_at) AS exp_us FROM pglimit_leases l
             WHERE l.id = ANY (ids) AND l.key <> ALL (p_keys) AND NOT l.released AND l.expires_at > now()
             ORDER BY l.key LOOP
        UPDATE pglimit_buckets SET log = pglimit_lease_drop(log, r.exp_us, r.slots) WHERE key = r.key;
        freed := freed || encode(r.key, 'hex');
    END LOOP;
    DELETE FROM pglimit_leases
    WHERE id = ANY (ids) OR id IN (SELECT l.id FROM pglimit_leases l WHERE l.key = ANY (p_keys));
    IF cardinality(freed) > 0 THEN
        PERFORM pg_notify('pglimit_actions', 'released ' || array_to_string(freed, ','));
    END IF;
END
$$;
