-- sendonce initial schema, SQLite flavour (see migrations/postgres for the
-- reasoning behind every column and constraint; only the types differ).
-- Times are INTEGER microseconds since the Unix epoch, so comparisons are
-- numeric; ids are 16-byte BLOBs; JSON is TEXT.

CREATE TABLE tenants (
    id          BLOB PRIMARY KEY,
    name        TEXT NOT NULL,
    created_at  INTEGER NOT NULL DEFAULT (CAST(strftime('%s', 'now') AS INTEGER) * 1000000),
    CONSTRAINT tenants_name_key UNIQUE (name)
);

CREATE TABLE api_keys (
    id          BLOB PRIMARY KEY,
    tenant_id   BLOB NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    key_hash    BLOB NOT NULL,
    key_prefix  TEXT NOT NULL,
    created_at  INTEGER NOT NULL DEFAULT (CAST(strftime('%s', 'now') AS INTEGER) * 1000000),
    revoked_at  INTEGER,
    CONSTRAINT api_keys_key_hash_key UNIQUE (key_hash)
);

CREATE TABLE messages (
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
    CONSTRAINT messages_tenant_key_key UNIQUE (tenant_id, idempotency_key),
    CONSTRAINT messages_status_check CHECK (status IN
        ('processing', 'sent', 'failed', 'unknown', 'delivered', 'undelivered')),
    CONSTRAINT messages_processing_is_owned_or_due CHECK (
        status <> 'processing'
        OR (lease_token IS NOT NULL AND lease_expires_at IS NOT NULL)
        OR next_attempt_at IS NOT NULL),
    CONSTRAINT messages_final_has_response CHECK (
        status = 'processing' OR (response_code IS NOT NULL AND response_body IS NOT NULL))
);

CREATE INDEX messages_due_idx ON messages (next_attempt_at) WHERE status = 'processing';
CREATE INDEX messages_lease_idx ON messages (lease_expires_at) WHERE status = 'processing';
CREATE INDEX messages_lease_owner_idx ON messages (lease_owner) WHERE status = 'processing';
CREATE INDEX messages_created_at_idx ON messages (created_at);

CREATE TABLE attempts (
    message_id          BLOB NOT NULL REFERENCES messages (id) ON DELETE CASCADE,
    number              INTEGER NOT NULL,
    lease_owner         TEXT,
    started_at          INTEGER NOT NULL,
    finished_at         INTEGER,
    outcome             TEXT,
    http_status         INTEGER,
    provider_code       TEXT,
    error               TEXT,
    provider_message_id TEXT,
    PRIMARY KEY (message_id, number)
);
