-- Hardening II (issue 18), SQLite flavour (see the Postgres migration for
-- the reasoning).

ALTER TABLE api_keys ADD COLUMN bootstrap INTEGER NOT NULL DEFAULT 0;

-- NULL: no list. Otherwise comma-separated senders (a sender holds no comma).
ALTER TABLE tenants ADD COLUMN allowed_senders TEXT;

CREATE INDEX messages_processing_created_idx ON messages (created_at)
    WHERE status = 'processing';
