-- The support console (issue 16): its sessions, who added an opt-out, and
-- the index behind "recent messages to this number".

-- A signed-in console user. The cookie holds a random id; only its SHA-256
-- is stored, so a copy of the database opens no session. A session lives
-- while the API key it signed in with is not revoked (every read joins
-- api_keys) and it was used within the idle timeout.
CREATE TABLE console_sessions (
    id_hash       bytea PRIMARY KEY,
    tenant_id     uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    key_hash      bytea NOT NULL REFERENCES api_keys (key_hash) ON DELETE CASCADE,
    -- The key's first characters: "who" on what the session changes.
    key_prefix    text NOT NULL,
    -- Every form of the session carries it; a POST without it is refused.
    csrf_token    text NOT NULL,
    created_at    timestamptz NOT NULL,
    last_seen_at  timestamptz NOT NULL
);
CREATE INDEX console_sessions_last_seen_idx ON console_sessions (last_seen_at);

-- Who added an opt-out from the console (the key prefix of the session);
-- NULL for opt-outs from the API or an inbound STOP.
ALTER TABLE opt_outs ADD COLUMN added_by text;

-- The console's search by phone number, newest first.
CREATE INDEX messages_tenant_to_created_idx ON messages (tenant_id, to_number, created_at DESC);
