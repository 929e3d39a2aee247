-- Citus mode's functions, each called with a route and delegated by Citus to
-- the worker holding that route's shard (create_distributed_function with
-- distribution_arg_name => 'p_route'), where it runs on that worker's shards
-- only: no two-phase commit, no lock on another node. Created at every start
-- (CREATE OR REPLACE) in the schema of this build's functions (schema.rs),
-- whose search path each keeps (SET search_path FROM CURRENT): the worker's
-- session that runs it has its own. Statements
-- on the distributed tables are planned for the values at hand
-- (force_custom_plan): the service's sessions force generic plans, with
-- which Citus cannot route a statement whose route is a parameter.

-- Locks shards `p_shards` (NULLs skipped) on this node against a shard
-- move as Citus' own writes lock them (a move blocks writes with an
-- ExclusiveLock on the shard's metadata; this RowExclusiveLock waits for
-- it, and it for this). A call that finds a shard gone (moved while the
-- call waited) fails with a serialization error rather than write into a
-- copy that is about to be dropped. One call for all of a statement's
-- shards: a PL/pgSQL call costs a worker more than the locks themselves.
-- Every name is qualified, so the function needs no search path of its
-- own: setting one on every call is a cost on every shard's upsert.
CREATE OR REPLACE FUNCTION pglimit_lock_shards(p_shards bigint[])
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_shards bigint[] := pg_catalog.array_remove(p_shards, NULL);
    v_gone   bigint;
BEGIN
    IF pg_catalog.cardinality(v_shards) = 0 THEN
        RETURN 0;  -- lock_shard_metadata refuses an empty array
    END IF;
    PERFORM pg_catalog.lock_shard_metadata(3, v_shards);
    SELECT s INTO v_gone FROM pg_catalog.unnest(v_shards) AS s
    WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_placement p
                      WHERE p.shardid = s
                        AND p.groupid = (SELECT groupid FROM pg_catalog.pg_dist_local_group))
    LIMIT 1;
    IF v_gone IS NOT NULL THEN
        RAISE EXCEPTION 'pglimit: shard % is not on this node', v_gone
            USING ERRCODE = 'serialization_failure', HINT = 'a shard move ended while the call waited; retry';
    END IF;
    RETURN 0;
END
$$;

-- The name of `p_table`'s shard for `p_route` on this node, locked as above.
CREATE OR REPLACE FUNCTION pglimit_local_shard(p_table regclass, p_route integer)
RETURNS text LANGUAGE sql SET search_path FROM CURRENT AS $$
    SELECT shard_name(p_table, s.id)
    FROM (SELECT get_shard_id_for_distribution_column(p_table, p_route) AS id) AS s
    WHERE pglimit_lock_shards(ARRAY[s.id]) IS NOT NULL
$$;

-- pglimit_check_batch (sql/batch.sql) for buckets whose shards are all on
-- one worker (p_routes: each bucket's route; p_route: any of them, which
-- sends the call to that worker): the same decisions, arguments and
-- answers. It reads and writes the shards' tables directly, route by route
-- in route order (so rows are locked in (route, key) order, as everywhere),
-- with the single-node function's set-based statements: statements on the
-- distributed tables would each go through Citus' planner, several times
-- the cost of the statement itself.
CREATE OR REPLACE FUNCTION pglimit_check_node(
    p_route        integer,
    p_routes       integer[],
    p_checks       integer[],
    p_keys         bytea[],
    p_limits       bigint[],
    p_windows_ms   bigint[],
    p_algos        smallint[],
    p_costs        bigint[],
    p_block_for_ms bigint[],
    p_names        text[],
    p_now          timestamptz,
    p_zones        text[]
) RETURNS TABLE (
    o_pos       integer,
    o_allowed   boolean,
    o_remaining bigint,
    o_reset_at  timestamptz,
    o_retry_at  timestamptz,
    o_now       timestamptz,
    o_blocked   boolean
) LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_now   timestamptz := coalesce(p_now, now());
    now_us  bigint := pglimit_us(v_now);
    n       integer := cardinality(p_keys);
    rs integer[] := ARRAY(SELECT DISTINCT x FROM unnest(p_routes) AS x ORDER BY 1);
    r integer; ri integer; buckets text[]; blocks text[]; k_route integer[]; r_keys bytea[];
    s_key bytea[]; s_count bigint[]; s_prev bigint[]; s_exp bigint[]; s_tat bigint[]; s_log jsonb[]; s_block bigint[];
    k_key bytea[]; k_count bigint[]; k_prev bigint[]; k_exp bigint[]; k_tat bigint[]; k_log jsonb[]; k_block bigint[];
    pos integer[]; d record;
BEGIN
    IF coalesce(n, 0) = 0 THEN
        RETURN;
    END IF;
    FOR ri IN 1..cardinality(rs) LOOP
        r := rs[ri];
        buckets := buckets || pglimit_local_shard('pglimit_buckets', r);
        blocks := blocks || pglimit_local_shard('pglimit_blocks', r);
        r_keys := ARRAY(SELECT k FROM unnest(p_keys, p_routes) AS u(k, kr) WHERE kr = r);
        -- DO UPDATE ... WHERE false writes nothing but still locks an existing row;
        -- a new one ends at the epoch, over for every clock (see sql/batch.sql).
        EXECUTE format('INSERT INTO %s AS t (route, key, count, expires_at)
                        SELECT DISTINCT $1, u.key, 0, timestamptz ''epoch'' FROM unnest($2) AS u(key) ORDER BY 2
                        ON CONFLICT (route, key) DO UPDATE SET count = t.count WHERE false', buckets[cardinality(buckets)])
        USING r, r_keys;
        EXECUTE format('SELECT array_agg(t.key ORDER BY t.key), array_agg(t.count ORDER BY t.key),
               array_agg(t.prev_count ORDER BY t.key), array_agg(pglimit_us(t.expires_at) ORDER BY t.key),
               array_agg(t.tat_us ORDER BY t.key),
               array_agg(CASE WHEN t.log IS NULL THEN NULL ELSE to_jsonb(t.log) END ORDER BY t.key),
               array_agg((SELECT pglimit_us(k.until) FROM %s k WHERE k.route = $1 AND k.key = t.key AND k.until > $2)
                         ORDER BY t.key)
        FROM %s t WHERE t.route = $1 AND t.key = ANY ($3)', blocks[cardinality(blocks)], buckets[cardinality(buckets)])
        INTO s_key, s_count, s_prev, s_exp, s_tat, s_log, s_block
        USING r, v_now, r_keys;
        k_key := k_key || s_key; k_count := k_count || s_count; k_prev := k_prev || s_prev;
        k_exp := k_exp || s_exp; k_tat := k_tat || s_tat; k_log := k_log || s_log; k_block := k_block || s_block;
        k_route := k_route || array_fill(r, ARRAY[cardinality(s_key)]);
    END LOOP;
    pos := ARRAY(SELECT array_position(k_key, u.key) FROM unnest(p_keys) WITH ORDINALITY AS u(key, o) ORDER BY u.o);
    d := pglimit_decide_batch(p_checks, pos, p_limits, p_windows_ms, p_algos, p_costs, p_block_for_ms, p_names,
                              p_zones, now_us, k_count, k_prev, k_exp, k_tat, k_log, k_block);

    FOR ri IN 1..cardinality(rs) LOOP
        EXECUTE format('UPDATE %s t SET
            count = s.c, prev_count = s.p, expires_at = pglimit_ts(s.e), tat_us = s.tt,
            log = CASE WHEN s.lg IS NULL THEN NULL ELSE pglimit_log_of(s.lg) END
        FROM unnest($2, $3, $4, $5, $6, $7, $8, $9) AS s(key, c, p, e, tt, lg, dirty, route)
        WHERE s.dirty AND s.route = $1 AND t.route = $1 AND t.key = s.key', buckets[ri])
        USING rs[ri], k_key, d.k_count, d.k_prev, d.k_exp, d.k_tat, d.k_log, d.k_dirty, k_route;
        CONTINUE WHEN NOT true = ANY (d.k_locked);
        EXECUTE format('INSERT INTO %s AS k (route, key, until, kind, policy, bucket)
        SELECT $1, s.key, pglimit_ts(s.until_us), ''lockout'', split_part(s.name, ''/'', 1), split_part(s.name, ''/'', 2)
        FROM unnest($2, $3, $4, $5, $6) AS s(key, until_us, locked, name, route)
        WHERE s.locked AND s.route = $1 ORDER BY s.key
        ON CONFLICT (route, key) DO UPDATE SET until = EXCLUDED.until, kind = ''lockout'',
            policy = EXCLUDED.policy, bucket = EXCLUDED.bucket, reason = NULL, created_at = now()
        WHERE k.until < EXCLUDED.until', blocks[ri])
        USING rs[ri], k_key, d.k_block, d.k_locked, d.k_name, k_route;
    END LOOP;

    RETURN QUERY
    SELECT r.o::integer, r.al, r.rem, pglimit_ts(r.fu), pglimit_ts(r.re), v_now, r.bl
    FROM unnest(d.a_allowed, d.a_rem, d.a_full, d.a_retry, d.a_blocked) WITH ORDINALITY AS r(al, rem, fu, re, bl, o);
END
$$;

-- Gives back what a check took on this worker when its buckets on another
-- worker denied it (a check across workers is all or nothing by taking on
-- each, then refunding). `p_at` is the clock the taking call used and
-- `p_resets` each bucket's reset time as it answered: they tell which
-- window took the cost, and nothing is given back to another, so a refund
-- never adds to a window what that window did not take.
CREATE OR REPLACE FUNCTION pglimit_refund_node(
    p_route      integer,
    p_routes     integer[],
    p_keys       bytea[],
    p_limits     bigint[],
    p_windows_ms bigint[],
    p_algos      smallint[],
    p_costs      bigint[],
    p_at         timestamptz,
    p_resets     timestamptz[]
) RETURNS void LANGUAGE plpgsql SET plan_cache_mode = force_custom_plan SET search_path FROM CURRENT AS $$
DECLARE
    at_us bigint := pglimit_us(p_at);
    i integer; k bytea; kr integer; cost bigint; reset timestamptz; win bigint; end_us bigint; step bigint; lg bigint[]; x integer;
BEGIN
    -- In (route, key) order, like every lock taken here; scalars in the
    -- statements (Citus 13.2's router planner crashed the backend on
    -- subscripted parameters).
    FOR i IN SELECT u.o FROM unnest(p_routes, p_keys) WITH ORDINALITY AS u(route, key, o) ORDER BY u.route, u.key LOOP
        k := p_keys[i]; kr := p_routes[i]; cost := p_costs[i]; win := p_windows_ms[i] * 1000;
        IF p_algos[i] = pglimit_fixed_window() THEN  -- fixed window: only the window that took it (its end is
            -- the reset time; its start may be later than p_at, the clock of a
            -- call that waited for the row's lock while another call began it)
            reset := p_resets[i];
            UPDATE pglimit_buckets SET count = greatest(count - cost, 0)
            WHERE route = kr AND key = k AND expires_at = reset;
        ELSIF p_algos[i] = pglimit_sliding_window() THEN  -- sliding window: the current window, or the previous one since
            end_us := pglimit_sliding_start(at_us, win) + win;
            UPDATE pglimit_buckets SET
                count      = CASE WHEN pglimit_us(expires_at) - win = end_us
                                  THEN greatest(count - cost, 0) ELSE count END,
                prev_count = CASE WHEN pglimit_us(expires_at) - win = end_us + win
                                  THEN greatest(prev_count - cost, 0) ELSE prev_count END
            WHERE route = kr AND key = k AND pglimit_us(expires_at) - win IN (end_us, end_us + win);
        ELSIF p_algos[i] = pglimit_sliding_log() THEN  -- sliding log: the entries stamped at p_at
            SELECT b.log INTO lg FROM pglimit_buckets b WHERE b.route = kr AND b.key = k FOR UPDATE;
            CONTINUE WHEN lg IS NULL;
            FOR n IN 1..cost LOOP
                x := array_position(lg, at_us);
                EXIT WHEN x IS NULL;
                lg := lg[1:x - 1] || lg[x + 1:];
            END LOOP;
            UPDATE pglimit_buckets SET log = lg WHERE route = kr AND key = k;
        ELSIF p_algos[i] = pglimit_token_bucket() THEN  -- token bucket: the theoretical arrival time moves back
            step := pglimit_token_step(win, p_limits[i]) * cost;
            UPDATE pglimit_buckets SET tat_us = tat_us - step, expires_at = pglimit_ts(tat_us - step)
            WHERE route = kr AND key = k AND tat_us IS NOT NULL;
        END IF;
    END LOOP;
END
$$;

-- The cleanup, one route at a time (a distributed DELETE with SKIP LOCKED
-- is refused): expired buckets, then ended blocks, on the route's shards
-- by name, as pglimit_check_node writes them: through the distributed
-- tables each DELETE was planned by Citus on every call, dearer than the
-- checks' own statements (docs/scaling.md).
CREATE OR REPLACE FUNCTION pglimit_cleanup_route(p_route integer, p_limit integer)
RETURNS bigint LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    gone bigint; more bigint;
BEGIN
    EXECUTE format('DELETE FROM %1$s WHERE route = $1 AND key IN (
        SELECT key FROM %1$s WHERE route = $1 AND expires_at <= now()
        ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED)', pglimit_local_shard('pglimit_buckets', p_route))
    USING p_route, p_limit;
    GET DIAGNOSTICS gone = ROW_COUNT;
    EXECUTE format('DELETE FROM %1$s WHERE route = $1 AND key IN (
        SELECT key FROM %1$s WHERE route = $1 AND until <= now()
        ORDER BY until LIMIT $2 FOR UPDATE SKIP LOCKED)', pglimit_local_shard('pglimit_blocks', p_route))
    USING p_route, p_limit;
    GET DIAGNOSTICS more = ROW_COUNT;
    RETURN gone + more;
END
$$;

-- Whether the worker holding a route answers: the health probe calls it for
-- every route, since the coordinator answering says nothing of the workers.
CREATE OR REPLACE FUNCTION pglimit_ping_route(p_route integer)
RETURNS integer LANGUAGE plpgsql SET plan_cache_mode = force_custom_plan SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM FROM pglimit_buckets WHERE route = p_route LIMIT 1;
    RETURN p_route;
END
$$;

SELECT create_distributed_function('pglimit_check_node(integer, integer[], integer[], bytea[], bigint[], bigint[], smallint[], bigint[], bigint[], text[], timestamptz, text[])',
                                   'p_route', colocate_with := 'pglimit_buckets');
SELECT create_distributed_function('pglimit_refund_node(integer, integer[], bytea[], bigint[], bigint[], smallint[], bigint[], timestamptz, timestamptz[])',
                                   'p_route', colocate_with := 'pglimit_buckets');
SELECT create_distributed_function('pglimit_cleanup_route(integer, integer)', 'p_route', colocate_with := 'pglimit_buckets');
SELECT create_distributed_function('pglimit_ping_route(integer)', 'p_route', colocate_with := 'pglimit_buckets');
