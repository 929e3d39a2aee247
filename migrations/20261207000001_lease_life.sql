-- Leases that cannot outlive their use (issue 46).
--   ends_by   the latest a renewal may take the lease to: when it was taken
--             plus its policy's max_lease_life (1 day for ad hoc keys).
--             Rows an older build inserts get the ad hoc bound.
-- A released lease's row now ends a minute after its release (so that a
-- repeated release still answers "already released"), and the cleanup
-- deletes it as any ended lease; a reset ends the leases of the buckets it
-- resets, which it finds by key.
ALTER TABLE pglimit_leases ADD COLUMN ends_by timestamptz NOT NULL DEFAULT now() + interval '1 day';
CREATE INDEX pglimit_leases_key ON pglimit_leases (key);
