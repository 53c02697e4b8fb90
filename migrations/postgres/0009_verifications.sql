-- Verifications (one-time codes). See docs/architecture.md, "Verifications".
-- The code is never stored in plain text: `code_mac` is an HMAC of it (for
-- checks) and `code_sealed` the code encrypted under a key derived from the
-- verify secret (for resends). Each send is an ordinary message whose
-- idempotency key is `<verification id>:send:<n>`; its body is sealed too.
CREATE TABLE verifications (
    id                uuid PRIMARY KEY,
    tenant_id         uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    idempotency_key   text NOT NULL,
    fingerprint       bytea NOT NULL,
    status            text NOT NULL,
    to_number         text NOT NULL,          -- E.164
    country           text,                   -- ISO 3166-1 alpha-2, when known
    prefix            text NOT NULL,          -- the number less its last 4 digits
    code_length       integer NOT NULL,
    code_mac          bytea NOT NULL,
    code_sealed       bytea NOT NULL,
    template          text,                   -- NULL: the default text
    sends             integer NOT NULL,
    checks_remaining  integer NOT NULL,
    created_at        timestamptz NOT NULL,
    expires_at        timestamptz NOT NULL,
    last_sent_at      timestamptz NOT NULL,
    approved_at       timestamptz,
    updated_at        timestamptz NOT NULL,
    CONSTRAINT verifications_tenant_key_key UNIQUE (tenant_id, idempotency_key),
    CONSTRAINT verifications_status_check CHECK (status IN
        ('pending', 'approved', 'expired', 'max_attempts_reached', 'canceled')),
    CONSTRAINT verifications_checks_check CHECK (checks_remaining >= 0)
);

CREATE INDEX verifications_number_idx ON verifications (tenant_id, to_number, created_at);
CREATE INDEX verifications_prefix_idx ON verifications (tenant_id, prefix, created_at);

-- Answers of idempotent checks and resends: a retried request with the same
-- key replays the first answer. Written in the transaction that made the
-- change it reports.
CREATE TABLE verification_ops (
    verification_id  uuid NOT NULL REFERENCES verifications (id) ON DELETE CASCADE,
    kind             text NOT NULL,           -- check | resend
    idempotency_key  text NOT NULL,
    fingerprint      bytea NOT NULL,
    response_code    smallint NOT NULL,
    response_body    bytea NOT NULL,
    created_at       timestamptz NOT NULL,
    PRIMARY KEY (verification_id, kind, idempotency_key)
);

-- Destination prefixes paused by the SMS-pumping defence, per tenant.
CREATE TABLE verify_pauses (
    tenant_id     uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    prefix        text NOT NULL,
    paused_until  timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, prefix)
);

-- The verify secret generated on first use when SENDONCE_VERIFY_SECRET is
-- not set (one row; the first writer wins).
CREATE TABLE verify_secrets (
    name        text PRIMARY KEY,
    secret      bytea NOT NULL,
    created_at  timestamptz NOT NULL
);
