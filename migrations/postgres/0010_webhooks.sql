-- Signed status webhooks and the events feed (issue 14). See
-- docs/architecture.md, "Webhooks and the events feed".

-- A tenant's webhook endpoints. `events` is a JSON array of event types, or
-- NULL for every type. The secret is `whsec_` + base64; a rotated-out secret
-- keeps signing beside the new one until `previous_secret_expires_at`.
CREATE TABLE webhook_endpoints (
    id                          uuid PRIMARY KEY,
    tenant_id                   uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    url                         text NOT NULL,
    events                      text,
    enabled                     boolean NOT NULL,
    disabled_reason             text,
    secret                      text NOT NULL,
    previous_secret             text,
    previous_secret_expires_at  timestamptz,
    created_at                  timestamptz NOT NULL,
    updated_at                  timestamptz NOT NULL
);

CREATE INDEX webhook_endpoints_tenant_idx ON webhook_endpoints (tenant_id, created_at);

-- The outbox and the feed: one row per event, written in the transaction of
-- the status change that causes it. `data` is the resource as it was then
-- (JSON). The feed reads in (txid, seq) order and only below the oldest
-- transaction still running, so a row committed late can never be skipped
-- by a cursor already past it.
CREATE TABLE webhook_events (
    seq         bigserial PRIMARY KEY,
    id          uuid NOT NULL UNIQUE,
    txid        bigint NOT NULL DEFAULT (pg_current_xact_id()::text::bigint),
    tenant_id   uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    type        text NOT NULL,
    message_id  uuid,
    data        bytea NOT NULL,
    created_at  timestamptz NOT NULL
);

CREATE INDEX webhook_events_feed_idx ON webhook_events (tenant_id, txid, seq);
CREATE INDEX webhook_events_created_idx ON webhook_events (created_at);

-- One row per (event, endpoint subscribed when the event was written): the
-- delivery's state, leased like messages (lease expiry in the database's
-- clock, due times in the service's).
CREATE TABLE webhook_deliveries (
    id                bigserial PRIMARY KEY,
    event_id          uuid NOT NULL REFERENCES webhook_events (id) ON DELETE CASCADE,
    endpoint_id       uuid NOT NULL REFERENCES webhook_endpoints (id) ON DELETE CASCADE,
    status            text NOT NULL,
    attempts          integer NOT NULL DEFAULT 0,
    next_attempt_at   timestamptz,
    lease_token       uuid,
    lease_owner       text,
    lease_expires_at  timestamptz,
    created_at        timestamptz NOT NULL,
    updated_at        timestamptz NOT NULL,
    CONSTRAINT webhook_deliveries_once UNIQUE (event_id, endpoint_id),
    CONSTRAINT webhook_deliveries_status_check CHECK (status IN
        ('pending', 'succeeded', 'failed', 'canceled')),
    CONSTRAINT webhook_deliveries_pending_due CHECK
        (status <> 'pending' OR next_attempt_at IS NOT NULL)
);

CREATE INDEX webhook_deliveries_due_idx ON webhook_deliveries (next_attempt_at)
    WHERE status = 'pending';
CREATE INDEX webhook_deliveries_endpoint_idx ON webhook_deliveries (endpoint_id)
    WHERE status = 'pending';

-- Every delivery attempt, with at most a short excerpt of the answer.
CREATE TABLE webhook_attempts (
    id                bigserial PRIMARY KEY,
    delivery_id       bigint NOT NULL REFERENCES webhook_deliveries (id) ON DELETE CASCADE,
    endpoint_id       uuid NOT NULL,
    event_id          uuid NOT NULL,
    event_type        text NOT NULL,
    number            integer NOT NULL,
    outcome           text NOT NULL,
    http_status       integer,
    error             text,
    response_excerpt  text,
    started_at        timestamptz NOT NULL,
    finished_at       timestamptz NOT NULL
);

CREATE INDEX webhook_attempts_endpoint_idx ON webhook_attempts (endpoint_id, id);
