-- Routing across several providers (issue 12).

-- The provider an attempt was made with. NULL means "the message's provider":
-- `messages.provider` changes only when a message moves on to the next
-- provider, and that write first stamps every such attempt with the provider
-- it was made with.
ALTER TABLE attempts ADD COLUMN provider text;

-- One circuit breaker per provider, shared by every instance. Changed only by
-- compare-and-set on `version`, so two instances never both take the one
-- half-open probe.
CREATE TABLE provider_circuits (
    provider          text PRIMARY KEY,
    state             text NOT NULL CHECK (state IN ('closed', 'open', 'half_open')),
    -- Failures in a row, counted since window_started_at.
    failures          integer NOT NULL,
    window_started_at timestamptz,
    opened_at         timestamptz,
    probe_started_at  timestamptz,
    version           bigint NOT NULL,
    updated_at        timestamptz NOT NULL
);

-- Routing events of a message (moved on to the next provider, a circuit its
-- attempt opened or closed), shown by GET /messages/{key}/events.
CREATE TABLE message_events (
    id          uuid PRIMARY KEY,
    message_id  uuid NOT NULL REFERENCES messages (id) ON DELETE CASCADE,
    at          timestamptz NOT NULL,
    kind        text NOT NULL,
    provider    text NOT NULL,
    to_provider text,
    detail      text NOT NULL
);
CREATE INDEX message_events_message_idx ON message_events (message_id, at);
