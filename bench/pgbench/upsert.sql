-- The reference single-row fixed-window upsert, one per transaction.
-- pgbench -D nkeys=N: keys 1..N at random (N = 1: one hot key).
\set k random(1, :nkeys)
INSERT INTO raw_limit (key, count, reset_at) VALUES (sha256(:k::text::bytea), 1, now() + interval '1 hour') ON CONFLICT (key) DO UPDATE SET count = CASE WHEN raw_limit.reset_at <= now() THEN 1 ELSE raw_limit.count + 1 END, reset_at = CASE WHEN raw_limit.reset_at <= now() THEN now() + interval '1 hour' ELSE raw_limit.reset_at END RETURNING count;
