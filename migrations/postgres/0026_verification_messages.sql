-- The verification a message carries a code of (issue 39), on every message
-- a verification sends (its start's, its resends', its next channels'),
-- NULL on every other. A verification that moves on to its next channel,
-- or ends, stops its messages that have not gone out (their `expires_at`
-- becomes that moment, in the transaction of the move or the end), and a
-- delivery checks that, in a write right before each provider call of such
-- a message: so nothing is sent after the verification moved on or ended.
-- Partial: other messages add no entry.
ALTER TABLE messages ADD COLUMN verification_id uuid;
CREATE INDEX messages_verification_id ON messages (verification_id)
    WHERE verification_id IS NOT NULL;
