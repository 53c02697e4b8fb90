-- Codes through the Telegram Gateway with SMS as the fallback (issue 28);
-- see migrations/postgres/0025_telegram_gateway.sql.
ALTER TABLE verifications ADD COLUMN channels TEXT NOT NULL DEFAULT 'sms';
ALTER TABLE verifications ADD COLUMN fallback_after_seconds INTEGER NOT NULL DEFAULT 0;

ALTER TABLE messages ADD COLUMN prepared_token TEXT;
CREATE UNIQUE INDEX messages_prepared_token_key ON messages (prepared_token)
    WHERE prepared_token IS NOT NULL;

CREATE TABLE verification_fallbacks (
    verification_id BLOB NOT NULL REFERENCES verifications (id) ON DELETE CASCADE,
    send_number     INTEGER NOT NULL,
    tenant_id       BLOB NOT NULL,
    message_id      BLOB NOT NULL REFERENCES messages (id) ON DELETE CASCADE,
    due_at          INTEGER NOT NULL,
    state           TEXT NOT NULL,
    updated_at      INTEGER NOT NULL,
    PRIMARY KEY (verification_id, send_number),
    CONSTRAINT verification_fallbacks_state_check CHECK (state IN
        ('waiting', 'delivered', 'fell_back', 'ended'))
);
CREATE INDEX verification_fallbacks_open ON verification_fallbacks (due_at)
    WHERE state IN ('waiting', 'delivered');
