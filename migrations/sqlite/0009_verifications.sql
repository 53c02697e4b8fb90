-- Verifications (one-time codes), SQLite flavour (see the Postgres migration
-- and docs/architecture.md, "Verifications").
CREATE TABLE verifications (
    id                BLOB PRIMARY KEY,
    tenant_id         BLOB NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    idempotency_key   TEXT NOT NULL,
    fingerprint       BLOB NOT NULL,
    status            TEXT NOT NULL,
    to_number         TEXT NOT NULL,
    country           TEXT,
    prefix            TEXT NOT NULL,
    code_length       INTEGER NOT NULL,
    code_mac          BLOB NOT NULL,
    code_sealed       BLOB NOT NULL,
    template          TEXT,
    sends             INTEGER NOT NULL,
    checks_remaining  INTEGER NOT NULL,
    created_at        INTEGER NOT NULL,
    expires_at        INTEGER NOT NULL,
    last_sent_at      INTEGER NOT NULL,
    approved_at       INTEGER,
    updated_at        INTEGER NOT NULL,
    CONSTRAINT verifications_tenant_key_key UNIQUE (tenant_id, idempotency_key),
    CONSTRAINT verifications_status_check CHECK (status IN
        ('pending', 'approved', 'expired', 'max_attempts_reached', 'canceled')),
    CONSTRAINT verifications_checks_check CHECK (checks_remaining >= 0)
);

CREATE INDEX verifications_number_idx ON verifications (tenant_id, to_number, created_at);
CREATE INDEX verifications_prefix_idx ON verifications (tenant_id, prefix, created_at);

CREATE TABLE verification_ops (
    verification_id  BLOB NOT NULL REFERENCES verifications (id) ON DELETE CASCADE,
    kind             TEXT NOT NULL,
    idempotency_key  TEXT NOT NULL,
    fingerprint      BLOB NOT NULL,
    response_code    INTEGER NOT NULL,
    response_body    BLOB NOT NULL,
    created_at       INTEGER NOT NULL,
    PRIMARY KEY (verification_id, kind, idempotency_key)
);

CREATE TABLE verify_pauses (
    tenant_id     BLOB NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    prefix        TEXT NOT NULL,
    paused_until  INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, prefix)
);

CREATE TABLE verify_secrets (
    name        TEXT PRIMARY KEY,
    secret      BLOB NOT NULL,
    created_at  INTEGER NOT NULL
);
