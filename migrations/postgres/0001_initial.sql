-- sendonce initial schema.
--
-- The messages row is the truth: everything a rescuer on any instance needs to
-- decide what to do with a message is here or in its attempts, never in a
-- process's memory.

-- A tenant is one customer; idempotency keys and messages are scoped to it.
CREATE TABLE tenants (
    id          uuid PRIMARY KEY,
    name        text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    -- Names are how operators refer to tenants on the command line.
    CONSTRAINT tenants_name_key UNIQUE (name)
);

-- API keys are stored only as a SHA-256 hash: the key has at least 128 random
-- bits, so a fast hash is not brute-forceable and lets every request look the
-- key up by an index instead of comparing against every row.
CREATE TABLE api_keys (
    id          uuid PRIMARY KEY,
    tenant_id   uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    key_hash    bytea NOT NULL,
    -- First characters of the key, for operators to recognise it in listings.
    key_prefix  text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz,
    CONSTRAINT api_keys_key_hash_key UNIQUE (key_hash)
);

CREATE TABLE messages (
    id                  uuid PRIMARY KEY,           -- UUIDv7, shown as msg_<uuid>
    tenant_id           uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    idempotency_key     text NOT NULL,
    -- SHA-256 of the canonical request: same key with another request is 422.
    fingerprint         bytea NOT NULL,
    status              text NOT NULL,
    to_number           text NOT NULL,
    from_sender         text,
    body                text NOT NULL,
    segments            integer NOT NULL,
    encoding            text NOT NULL,
    metadata            jsonb NOT NULL DEFAULT '{}'::jsonb,
    validity_seconds    integer,
    provider            text NOT NULL,
    provider_message_id text,
    -- Number of attempts started; the attempts table has one row per attempt.
    attempts            integer NOT NULL DEFAULT 0,
    -- Some attempt ended without a clear answer (timeout after sending, 5xx,
    -- an owner that died mid-call): the provider may have sent it. Giving up
    -- on such a message ends it `unknown`, never `failed`.
    maybe_sent          boolean NOT NULL DEFAULT false,
    error               jsonb,
    -- The frozen final response (status code and exact body bytes) replayed
    -- to every retry of the same request. Set once, with the final status.
    response_code       smallint,
    response_body       bytea,
    -- Lease: who may act on this message now and until when. The token is
    -- new for every claim, so even two claims by one instance are told apart;
    -- every finishing write is fenced on it.
    lease_token         uuid,
    lease_owner         text,
    lease_expires_at    timestamptz,
    -- Due time of the next attempt when a retry waits (backoff, Retry-After).
    -- A waiting message holds no lease: any instance picks it up when due.
    next_attempt_at     timestamptz,
    created_at          timestamptz NOT NULL,
    updated_at          timestamptz NOT NULL,
    sent_at             timestamptz,
    -- After expires_at (created_at + validity_seconds) the message is not
    -- handed to the provider any more.
    expires_at          timestamptz,
    -- After deadline_at no new attempt is started (total retry deadline).
    deadline_at         timestamptz NOT NULL,
    finalized_at        timestamptz,

    -- The race between two requests or two instances with one key is decided
    -- here, and only here.
    CONSTRAINT messages_tenant_key_key UNIQUE (tenant_id, idempotency_key),
    CONSTRAINT messages_status_check CHECK (status IN
        ('processing', 'sent', 'failed', 'unknown', 'delivered', 'undelivered')),
    -- A message in flight always has an owner with a lease, or a due time at
    -- which any instance may claim it: nothing can be left stranded.
    CONSTRAINT messages_processing_is_owned_or_due CHECK (
        status <> 'processing'
        OR (lease_token IS NOT NULL AND lease_expires_at IS NOT NULL)
        OR next_attempt_at IS NOT NULL),
    -- A final message has its frozen response.
    CONSTRAINT messages_final_has_response CHECK (
        status = 'processing' OR (response_code IS NOT NULL AND response_body IS NOT NULL))
);

-- The rescuer/scheduler's scan: only in-flight rows are indexed, so the index
-- stays small however many final messages are kept.
CREATE INDEX messages_due_idx ON messages (next_attempt_at) WHERE status = 'processing';
CREATE INDEX messages_lease_idx ON messages (lease_expires_at) WHERE status = 'processing';
-- Releasing an instance's leases on shutdown.
CREATE INDEX messages_lease_owner_idx ON messages (lease_owner) WHERE status = 'processing';
-- Retention purge walks messages by age.
CREATE INDEX messages_created_at_idx ON messages (created_at);

-- One row per provider attempt, so a message's history can be inspected and a
-- rescuer can tell "started, no answer recorded" (ambiguous) from "never tried".
CREATE TABLE attempts (
    message_id          uuid NOT NULL REFERENCES messages (id) ON DELETE CASCADE,
    number              integer NOT NULL,
    lease_owner         text,
    started_at          timestamptz NOT NULL,
    finished_at         timestamptz,
    -- sent | rejected | retryable | ambiguous | expired | reconciled | lost;
    -- NULL while the attempt is open.
    outcome             text,
    http_status         integer,
    provider_code       text,
    error               text,
    provider_message_id text,
    PRIMARY KEY (message_id, number)
);
