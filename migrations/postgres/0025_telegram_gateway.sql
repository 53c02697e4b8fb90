-- Codes through the Telegram Gateway with SMS as the fallback (issue 28).
--
-- A verification keeps the channels it goes through, in order, and how
-- long a Telegram message has to be reported delivered before the next
-- channel is used.
ALTER TABLE verifications ADD COLUMN channels text NOT NULL DEFAULT 'sms';
ALTER TABLE verifications ADD COLUMN fallback_after_seconds integer NOT NULL DEFAULT 0;

-- What a provider's first call handed out for the message's send (the
-- Gateway's `request_id` from checkSendAbility), written fenced on the lease
-- before the send that carries it; every retry reuses it. It belongs to one
-- message: the database says so. Partial: the messages of every other
-- provider have none, and their inserts add no entry to it.
ALTER TABLE messages ADD COLUMN prepared_token text;
CREATE UNIQUE INDEX messages_prepared_token_key ON messages (prepared_token)
    WHERE prepared_token IS NOT NULL;

-- One row per Telegram send of a verification, written in the transaction
-- of the start or resend that makes the send: whether the next channel is
-- still to come (`waiting`), not needed (`delivered`), used (`fell_back`),
-- or the verification ended (`ended`, its Telegram message revoked).
CREATE TABLE verification_fallbacks (
    verification_id uuid NOT NULL REFERENCES verifications (id) ON DELETE CASCADE,
    send_number     integer NOT NULL,
    tenant_id       uuid NOT NULL,
    message_id      uuid NOT NULL REFERENCES messages (id) ON DELETE CASCADE,
    due_at          timestamptz NOT NULL,
    state           text NOT NULL,
    updated_at      timestamptz NOT NULL,
    PRIMARY KEY (verification_id, send_number),
    CONSTRAINT verification_fallbacks_state_check CHECK (state IN
        ('waiting', 'delivered', 'fell_back', 'ended'))
);
CREATE INDEX verification_fallbacks_open ON verification_fallbacks (due_at)
    WHERE state IN ('waiting', 'delivered');
