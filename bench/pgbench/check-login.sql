-- pglimit.check from SQL of the `login` policy (three buckets), one check
-- per transaction, on the identities login.sql and bench/check.lua's login
-- mode draw. pgbench -D emails=E -D ips=I. No colon in a literal: pgbench
-- would take ":name" there for a variable.
\set e random(1, :emails)
\set i random(0, :ips - 1)
\set a 18 + :i / 65536
\set b (:i / 256) % 256
\set c :i % 256
SELECT * FROM pglimit.check('login', jsonb_build_object('email', 'u' || :e::text || '@example.org', 'ip', '198.' || :a::text || '.' || :b::text || '.' || :c::text));
