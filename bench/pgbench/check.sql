-- pglimit.check from SQL (bench/run's pglimit-sql rows): one check per
-- transaction of the one-bucket fixed-window policy `bench_one`
-- (bench/policies-sql.toml), the fair match of upsert.sql's one row, on
-- keys 1..N at random as upsert.sql draws them. pgbench -D nkeys=N.
\set k random(1, :nkeys)
SELECT * FROM pglimit.check('bench_one', jsonb_build_object('key', :k::text));
