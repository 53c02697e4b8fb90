-- no-transaction
-- Issue 15: scheduled sends and cancel (see migrations/postgres/0011).
--
-- SQLite cannot change a CHECK constraint in place, so `messages` is rebuilt
-- (SQLite's documented procedure: foreign keys off, new table, copy, drop,
-- rename, indexes, foreign_key_check, all in one transaction). Foreign keys
-- must be off while the old table is dropped, or the drop would cascade to
-- attempts, receipts and events; that pragma cannot change inside a
-- transaction, hence `no-transaction` and the explicit BEGIN/COMMIT.
PRAGMA foreign_keys = OFF;

BEGIN IMMEDIATE;

CREATE TABLE messages_new (
    id                  BLOB PRIMARY KEY,
    tenant_id           BLOB NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    idempotency_key     TEXT NOT NULL,
    fingerprint         BLOB NOT NULL,
    status              TEXT NOT NULL,
    to_number           TEXT NOT NULL,
    from_sender         TEXT,
    body                TEXT NOT NULL,
    segments            INTEGER NOT NULL,
    encoding            TEXT NOT NULL,
    metadata            TEXT NOT NULL DEFAULT '{}',
    validity_seconds    INTEGER,
    provider            TEXT NOT NULL,
    provider_message_id TEXT,
    attempts            INTEGER NOT NULL DEFAULT 0,
    maybe_sent          INTEGER NOT NULL DEFAULT 0,
    error               TEXT,
    response_code       INTEGER,
    response_body       BLOB,
    lease_token         BLOB,
    lease_owner         TEXT,
    lease_expires_at    INTEGER,
    next_attempt_at     INTEGER,
    created_at          INTEGER NOT NULL,
    updated_at          INTEGER NOT NULL,
    sent_at             INTEGER,
    expires_at          INTEGER,
    deadline_at         INTEGER NOT NULL,
    finalized_at        INTEGER,
    delivery_status_at  INTEGER,
    send_at             INTEGER,
    CONSTRAINT messages_tenant_key_key UNIQUE (tenant_id, idempotency_key),
    CONSTRAINT messages_status_check CHECK (status IN
        ('scheduled', 'processing', 'sent', 'failed', 'unknown', 'delivered', 'undelivered',
         'canceled')),
    CONSTRAINT messages_processing_is_owned_or_due CHECK (
        status <> 'processing'
        OR (lease_token IS NOT NULL AND lease_expires_at IS NOT NULL)
        OR next_attempt_at IS NOT NULL),
    CONSTRAINT messages_final_has_response CHECK (
        status IN ('processing', 'scheduled') OR (response_code IS NOT NULL AND response_body IS NOT NULL)),
    CONSTRAINT messages_scheduled_is_due_and_free CHECK (
        status <> 'scheduled' OR (next_attempt_at IS NOT NULL AND lease_token IS NULL))
);

INSERT INTO messages_new (id, tenant_id, idempotency_key, fingerprint, status, to_number, from_sender, body, segments, encoding, metadata, validity_seconds, provider, provider_message_id, attempts, maybe_sent, error, response_code, response_body, lease_token, lease_owner, lease_expires_at, next_attempt_at, created_at, updated_at, sent_at, expires_at, deadline_at, finalized_at, delivery_status_at)
    SELECT id, tenant_id, idempotency_key, fingerprint, status, to_number, from_sender, body, segments, encoding, metadata, validity_seconds, provider, provider_message_id, attempts, maybe_sent, error, response_code, response_body, lease_token, lease_owner, lease_expires_at, next_attempt_at, created_at, updated_at, sent_at, expires_at, deadline_at, finalized_at, delivery_status_at FROM messages;

DROP TABLE messages;
ALTER TABLE messages_new RENAME TO messages;

CREATE INDEX messages_due_idx ON messages (next_attempt_at) WHERE status = 'processing';
CREATE INDEX messages_lease_idx ON messages (lease_expires_at) WHERE status = 'processing';
CREATE INDEX messages_lease_owner_idx ON messages (lease_owner) WHERE status = 'processing';
CREATE INDEX messages_created_at_idx ON messages (created_at);
CREATE INDEX messages_provider_message_id_idx ON messages (provider, provider_message_id)
    WHERE provider_message_id IS NOT NULL;
CREATE INDEX messages_processing_created_idx ON messages (created_at)
    WHERE status = 'processing';
CREATE INDEX messages_scheduled_idx ON messages (next_attempt_at) WHERE status = 'scheduled';

-- Quiet hours: a tenant's daily window (`21:00-08:00`) in the recipient's
-- local time; NULL is none.
ALTER TABLE tenants ADD COLUMN quiet_hours TEXT;

PRAGMA foreign_key_check;

COMMIT;

PRAGMA foreign_keys = ON;
