-- The raw baseline of the login scenario: the reference upsert for each of
-- the `login` policy's three buckets (email+ip 5/1m, ip 20/1m, email 50/15m),
-- in one transaction, on keys hashed from the same identities as
-- bench/check.lua's login mode. pgbench -D emails=E -D ips=I. No colon in
-- a literal: pgbench would take ":name" there for a variable.
\set e random(1, :emails)
\set i random(0, :ips - 1)
\set a 18 + :i / 65536
\set b (:i / 256) % 256
\set c :i % 256
BEGIN;
INSERT INTO raw_limit (key, count, reset_at) VALUES (sha256(('email_ip/u' || :e::text || '@example.org|198.' || :a::text || '.' || :b::text || '.' || :c::text)::bytea), 1, now() + interval '1 minute') ON CONFLICT (key) DO UPDATE SET count = CASE WHEN raw_limit.reset_at <= now() THEN 1 ELSE raw_limit.count + 1 END, reset_at = CASE WHEN raw_limit.reset_at <= now() THEN now() + interval '1 minute' ELSE raw_limit.reset_at END RETURNING count <= 5;
INSERT INTO raw_limit (key, count, reset_at) VALUES (sha256(('ip/198.' || :a::text || '.' || :b::text || '.' || :c::text)::bytea), 1, now() + interval '1 minute') ON CONFLICT (key) DO UPDATE SET count = CASE WHEN raw_limit.reset_at <= now() THEN 1 ELSE raw_limit.count + 1 END, reset_at = CASE WHEN raw_limit.reset_at <= now() THEN now() + interval '1 minute' ELSE raw_limit.reset_at END RETURNING count <= 20;
INSERT INTO raw_limit (key, count, reset_at) VALUES (sha256(('email/u' || :e::text || '@example.org')::bytea), 1, now() + interval '15 minutes') ON CONFLICT (key) DO UPDATE SET count = CASE WHEN raw_limit.reset_at <= now() THEN 1 ELSE raw_limit.count + 1 END, reset_at = CASE WHEN raw_limit.reset_at <= now() THEN now() + interval '15 minutes' ELSE raw_limit.reset_at END RETURNING count <= 50;
END;
