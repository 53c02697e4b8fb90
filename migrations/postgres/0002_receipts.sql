-- Delivery receipts (DLRs).
--
-- Providers call back late, out of order and more than once. Every receipt is
-- stored once under the provider's own event identity (the unique constraint
-- below is the whole de-duplication), matched to a message by the provider's
-- message id, and may move the message's status forward only: `sent` to
-- `delivered` or `undelivered`, never back. The frozen POST response is not
-- touched: replays stay byte for byte what they were.

-- When a receipt moved the message to `delivered` / `undelivered`.
ALTER TABLE messages ADD COLUMN delivery_status_at timestamptz;

-- Receipts find their message by the provider's id for it.
CREATE INDEX messages_provider_message_id_idx ON messages (provider, provider_message_id)
    WHERE provider_message_id IS NOT NULL;

CREATE TABLE receipts (
    -- Arrival order: "the first receipt that reported a final delivery
    -- status" is decided by it, not by clocks.
    seq                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- `twilio` or `http`: which endpoint received it.
    provider            text NOT NULL,
    -- The provider's identity of this event: Twilio's I-Twilio-Idempotency-Token
    -- (else MessageSid:MessageStatus), the http provider's event_id.
    event_id            text NOT NULL,
    provider_message_id text NOT NULL,
    -- NULL: no message with that provider id (yet). Kept for inspection;
    -- linked if the message's own write of the id arrives later.
    message_id          uuid REFERENCES messages (id) ON DELETE CASCADE,
    -- The status as the provider spelled it (`queued`, `delivered`, `failed`, ...).
    provider_status     text NOT NULL,
    -- What it means for us; NULL when it is not a status we track.
    status              text,
    error_code          text,
    -- This receipt is the one that moved the message's status.
    applied             boolean NOT NULL DEFAULT false,
    received_at         timestamptz NOT NULL,
    CONSTRAINT receipts_provider_event_key UNIQUE (provider, event_id),
    CONSTRAINT receipts_status_check CHECK (status IN ('sent', 'delivered', 'undelivered'))
);

-- A message's history.
CREATE INDEX receipts_message_idx ON receipts (message_id, seq) WHERE message_id IS NOT NULL;
-- Receipts waiting for their message, and their purge.
CREATE INDEX receipts_unmatched_idx ON receipts (provider, provider_message_id)
    WHERE message_id IS NULL;
CREATE INDEX receipts_unmatched_received_idx ON receipts (received_at) WHERE message_id IS NULL;
