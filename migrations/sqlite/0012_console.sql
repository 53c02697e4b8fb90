-- The support console (issue 16); see the Postgres migration for the
-- reasoning.

CREATE TABLE console_sessions (
    id_hash       BLOB PRIMARY KEY,
    tenant_id     BLOB NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    key_hash      BLOB NOT NULL REFERENCES api_keys (key_hash) ON DELETE CASCADE,
    key_prefix    TEXT NOT NULL,
    csrf_token    TEXT NOT NULL,
    created_at    INTEGER NOT NULL,
    last_seen_at  INTEGER NOT NULL
);
CREATE INDEX console_sessions_last_seen_idx ON console_sessions (last_seen_at);

ALTER TABLE opt_outs ADD COLUMN added_by TEXT;

CREATE INDEX messages_tenant_to_created_idx ON messages (tenant_id, to_number, created_at DESC);
