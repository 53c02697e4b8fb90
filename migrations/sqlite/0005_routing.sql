-- Routing across several providers (see the Postgres migration for the
-- reasoning).

ALTER TABLE attempts ADD COLUMN provider TEXT;

CREATE TABLE provider_circuits (
    provider          TEXT PRIMARY KEY,
    state             TEXT NOT NULL CHECK (state IN ('closed', 'open', 'half_open')),
    failures          INTEGER NOT NULL,
    window_started_at INTEGER,
    opened_at         INTEGER,
    probe_started_at  INTEGER,
    version           INTEGER NOT NULL,
    updated_at        INTEGER NOT NULL
);

CREATE TABLE message_events (
    id          BLOB PRIMARY KEY,
    message_id  BLOB NOT NULL REFERENCES messages (id) ON DELETE CASCADE,
    at          INTEGER NOT NULL,
    kind        TEXT NOT NULL,
    provider    TEXT NOT NULL,
    to_provider TEXT,
    detail      TEXT NOT NULL
);
CREATE INDEX message_events_message_idx ON message_events (message_id, at);
