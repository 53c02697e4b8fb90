-- Signed status webhooks and the events feed (issue 14), SQLite flavour (see
-- the Postgres migration and docs/architecture.md). One writer commits at a
-- time, so `seq` order is commit order and `txid` is always 0.
CREATE TABLE webhook_endpoints (
    id                          BLOB PRIMARY KEY,
    tenant_id                   BLOB NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    url                         TEXT NOT NULL,
    events                      TEXT,
    enabled                     INTEGER NOT NULL,
    disabled_reason             TEXT,
    secret                      TEXT NOT NULL,
    previous_secret             TEXT,
    previous_secret_expires_at  INTEGER,
    created_at                  INTEGER NOT NULL,
    updated_at                  INTEGER NOT NULL
);

CREATE INDEX webhook_endpoints_tenant_idx ON webhook_endpoints (tenant_id, created_at);

CREATE TABLE webhook_events (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    id          BLOB NOT NULL UNIQUE,
    txid        INTEGER NOT NULL DEFAULT 0,
    tenant_id   BLOB NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    type        TEXT NOT NULL,
    message_id  BLOB,
    data        BLOB NOT NULL,
    created_at  INTEGER NOT NULL
);

CREATE INDEX webhook_events_feed_idx ON webhook_events (tenant_id, txid, seq);
CREATE INDEX webhook_events_created_idx ON webhook_events (created_at);

CREATE TABLE webhook_deliveries (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id          BLOB NOT NULL REFERENCES webhook_events (id) ON DELETE CASCADE,
    endpoint_id       BLOB NOT NULL REFERENCES webhook_endpoints (id) ON DELETE CASCADE,
    status            TEXT NOT NULL,
    attempts          INTEGER NOT NULL DEFAULT 0,
    next_attempt_at   INTEGER,
    lease_token       BLOB,
    lease_owner       TEXT,
    lease_expires_at  INTEGER,
    created_at        INTEGER NOT NULL,
    updated_at        INTEGER NOT NULL,
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

CREATE TABLE webhook_attempts (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    delivery_id       INTEGER NOT NULL REFERENCES webhook_deliveries (id) ON DELETE CASCADE,
    endpoint_id       BLOB NOT NULL,
    event_id          BLOB NOT NULL,
    event_type        TEXT NOT NULL,
    number            INTEGER NOT NULL,
    outcome           TEXT NOT NULL,
    http_status       INTEGER,
    error             TEXT,
    response_excerpt  TEXT,
    started_at        INTEGER NOT NULL,
    finished_at       INTEGER NOT NULL
);

CREATE INDEX webhook_attempts_endpoint_idx ON webhook_attempts (endpoint_id, id);
