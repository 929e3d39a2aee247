-- Overrides set through the API (POST /admin/overrides), tried before the
-- policy file's. `match` maps identifier names to patterns: "hmac:<hex>"
-- for an exact value (keyed as bucket keys are, so no raw identifier is
-- stored), or what the operator wrote for "*@domain" and CIDR patterns.
-- `limits` maps bucket names to limits (action 'limits' only). A row past
-- `until` no longer applies; the next POST deletes it.
CREATE TABLE pglimit_overrides (
    id         text        PRIMARY KEY,
    policy     text        NOT NULL,
    match      jsonb       NOT NULL,
    action     text        NOT NULL CHECK (action IN ('limits', 'unlimited', 'deny')),
    limits     jsonb,
    until      timestamptz,
    note       text,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX pglimit_overrides_policy ON pglimit_overrides (policy, created_at);

-- Bumped (with generation) by every change to pglimit_overrides, which
-- notifies channel pglimit_actions with '<generation> overrides'; an
-- instance reloads its overrides when it reads a value it has not loaded.
ALTER TABLE pglimit_actions ADD COLUMN overrides bigint NOT NULL DEFAULT 0;
