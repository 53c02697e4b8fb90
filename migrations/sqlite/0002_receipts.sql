-- Delivery receipts, SQLite flavour (see migrations/postgres/0002_receipts.sql
-- for the reasoning; only the types differ). `seq` is the rowid: arrival order.

ALTER TABLE messages ADD COLUMN delivery_status_at INTEGER;

CREATE INDEX messages_provider_message_id_idx ON messages (provider, provider_message_id)
    WHERE provider_message_id IS NOT NULL;

CREATE TABLE receipts (
    seq                 INTEGER PRIMARY KEY AUTOINCREMENT,
    provider            TEXT NOT NULL,
    event_id            TEXT NOT NULL,
    provider_message_id TEXT NOT NULL,
    message_id          BLOB REFERENCES messages (id) ON DELETE CASCADE,
    provider_status     TEXT NOT NULL,
    status              TEXT,
    error_code          TEXT,
    applied             INTEGER NOT NULL DEFAULT 0,
    received_at         INTEGER NOT NULL,
    CONSTRAINT receipts_provider_event_key UNIQUE (provider, event_id),
    CONSTRAINT receipts_status_check CHECK (status IN ('sent', 'delivered', 'undelivered'))
);

CREATE INDEX receipts_message_idx ON receipts (message_id, seq) WHERE message_id IS NOT NULL;
CREATE INDEX receipts_unmatched_idx ON receipts (provider, provider_message_id)
    WHERE message_id IS NULL;
CREATE INDEX receipts_unmatched_received_idx ON receipts (received_at) WHERE message_id IS NULL;
