-- Citus mode: every table a check touches is distributed by `route`, a small
-- number the service derives from the key (pglimit_routes: one route per
-- shard), so that each call the service makes touches exactly one shard and
-- runs on the worker that holds it, with no two-phase commit.
--
-- Applied once, by the first instance that finds pglimit_buckets not yet
-- distributed, after the ordinary migrations and under an advisory lock.
-- Counters start afresh (they are deleted, not moved); blocks are kept.

DELETE FROM pglimit_buckets;
ALTER TABLE pglimit_buckets ADD COLUMN route integer NOT NULL;
ALTER TABLE pglimit_buckets DROP CONSTRAINT pglimit_buckets_pkey;
ALTER TABLE pglimit_buckets ADD PRIMARY KEY (route, key);
SELECT create_distributed_table('pglimit_buckets', 'route');

-- Slot s (the key's first two bytes, modulo the number of slots) uses route
-- pglimit_routes.route: the smallest integer that Citus places on the s-th
-- shard. Written once; the service reads it at start.
CREATE TABLE pglimit_routes (
    slot  integer PRIMARY KEY,
    route integer NOT NULL
);
INSERT INTO pglimit_routes (slot, route)
SELECT (row_number() OVER (ORDER BY s.shardid) - 1)::integer, s.route
FROM (SELECT get_shard_id_for_distribution_column('pglimit_buckets', v) AS shardid, min(v) AS route
      FROM generate_series(0, 1000 * current_setting('citus.shard_count')::integer) AS v
      GROUP BY 1) AS s;
SELECT create_reference_table('pglimit_routes');

ALTER TABLE pglimit_blocks ADD COLUMN route integer;
UPDATE pglimit_blocks k SET route = r.route FROM pglimit_routes r
WHERE r.slot = ((get_byte(k.key, 0) << 8) | get_byte(k.key, 1)) % (SELECT count(*) FROM pglimit_routes);
ALTER TABLE pglimit_blocks ALTER COLUMN route SET NOT NULL;
ALTER TABLE pglimit_blocks DROP CONSTRAINT pglimit_blocks_pkey;
ALTER TABLE pglimit_blocks ADD PRIMARY KEY (route, key);
SELECT create_distributed_table('pglimit_blocks', 'route', colocate_with := 'pglimit_buckets');
