-- Concurrency buckets' leases: taking them (in the check's own statement),
-- releasing and renewing them. A bucket's row holds one expiry per held
-- slot (algorithms.sql, pglimit_decide's algo 4); a lease's row in
-- pglimit_leases says which expiry, and how many slots, in which rows.
-- Entries with the same expiry are interchangeable, so removing `slots` of
-- them frees exactly this lease's slots whichever lease put them there.
--
-- Releasing and renewing lock the bucket rows first, in key order, as
-- checks do (which then only insert lease rows of a new id): no deadlock.

-- `entries` without `n` of the entries equal to `expiry`.
CREATE FUNCTION pglimit_lease_drop(entries bigint[], expiry bigint, n bigint) RETURNS bigint[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN ARRAY(
    SELECT s.x FROM (SELECT u.x, row_number() OVER (PARTITION BY u.x) AS i
                     FROM unnest(coalesce(entries, '{}')) AS u(x)) AS s
    WHERE s.x <> expiry OR s.i > n ORDER BY s.x);

-- The lease rows of a batch's admitted checks: one per concurrency bucket
-- of a check given a lease id (p_leases, per bucket), ending as the
-- bucket's new entries do.
CREATE FUNCTION pglimit_take_leases(
    p_checks integer[], p_keys bytea[], p_windows_ms bigint[], p_algos smallint[], p_costs bigint[],
    p_leases bytea[], a_allowed boolean[], v_now timestamptz
) RETURNS void LANGUAGE sql AS $$
    INSERT INTO pglimit_leases (id, key, slots, lease_us, expires_at)
    SELECT r.id, r.key, r.cost, r.win * 1000, pglimit_ts(pglimit_us(v_now) + r.win * 1000)
    FROM (SELECT u.*, bool_and(u.al) OVER (PARTITION BY u.chk) AS admit
          FROM unnest(p_checks, p_keys, p_windows_ms, p_algos, p_costs, p_leases, a_allowed)
               AS u(chk, key, win, algo, cost, id, al)) AS r
    WHERE r.admit AND r.cost > 0 AND r.algo = 4 AND octet_length(r.id) = 32
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
-- ended and was cleaned up). Notifies pglimit_actions with `released <hex
-- key>,...`: the listener forgets denials of those keys, and a waiter may
-- take the slot.
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
    UPDATE pglimit_leases SET released = true WHERE id = p_id AND NOT released;
    IF cardinality(freed) > 0 THEN
        PERFORM pg_notify('pglimit_actions', 'released ' || array_to_string(freed, ','));
    END IF;
    RETURN cardinality(freed) > 0;
END
$$;

-- Extends lease `p_id` by each bucket's lease time from now; returns when
-- it ends now (the earliest of its buckets), NULL if it has ended, was
-- released, or does not exist. Only the slots still in a row are moved:
-- one a reset freed stays free.
CREATE FUNCTION pglimit_renew(p_id bytea) RETURNS timestamptz LANGUAGE plpgsql AS $$
DECLARE
    now_us bigint := pglimit_us(now()); r record; ends bigint; entries bigint[]; kept bigint[]; n integer;
BEGIN
    PERFORM pglimit_lock_lease(p_id);
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
    RETURN pglimit_ts(ends);
END
$$;
