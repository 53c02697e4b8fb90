-- A verification's channels in any order, one step at a time (issue 40);
-- see migrations/postgres/0027_channel_steps.sql. SQLite cannot change a
-- primary key: the table is made anew with its rows.
CREATE TABLE verification_fallbacks_new (
    verification_id BLOB NOT NULL REFERENCES verifications (id) ON DELETE CASCADE,
    send_number     INTEGER NOT NULL,
    step            INTEGER NOT NULL DEFAULT 0,
    tenant_id       BLOB NOT NULL,
    message_id      BLOB NOT NULL REFERENCES messages (id) ON DELETE CASCADE,
    due_at          INTEGER NOT NULL,
    state           TEXT NOT NULL,
    updated_at      INTEGER NOT NULL,
    PRIMARY KEY (verification_id, send_number, step),
    CONSTRAINT verification_fallbacks_state_check CHECK (state IN
        ('waiting', 'delivered', 'fell_back', 'ended'))
);
INSERT INTO verification_fallbacks_new (verification_id, send_number, step, tenant_id,
        message_id, due_at, state, updated_at)
    SELECT verification_id, send_number, 0, tenant_id, message_id, due_at, state, updated_at
    FROM verification_fallbacks;
DROP TABLE verification_fallbacks;
ALTER TABLE verification_fallbacks_new RENAME TO verification_fallbacks;
CREATE INDEX verification_fallbacks_open ON verification_fallbacks (due_at)
    WHERE state IN ('waiting', 'delivered');

ALTER TABLE verifications ADD COLUMN fallback_after_list TEXT;

-- Inbound updates of every channel of its own (issue 40): taken once under
-- (channel, source, event id).
CREATE TABLE inbound_updates (
    channel     TEXT NOT NULL,
    source      INTEGER NOT NULL,
    event_id    INTEGER NOT NULL,
    received_at INTEGER NOT NULL,
    PRIMARY KEY (channel, source, event_id)
);
INSERT INTO inbound_updates (channel, source, event_id, received_at)
    SELECT 'telegram', bot_id, update_id, received_at FROM telegram_updates;
DROP TABLE telegram_updates;
CREATE INDEX inbound_updates_received_at ON inbound_updates (received_at);

ALTER TABLE tenants ADD COLUMN verify_channels TEXT;

ALTER TABLE receipts ADD COLUMN our_message_id BLOB;
CREATE INDEX receipts_our_message_idx ON receipts (our_message_id)
    WHERE our_message_id IS NOT NULL;
