-- Keeping the promise (issue 24).

-- A provider's message id belongs to one message. Reconciliation used to ask
-- "who holds this id?" with a plain read, so a message whose own send was
-- never created could take a sibling's message (same recipient, sender and
-- body) before the sibling wrote its id, and both ended `sent` under one id:
-- one send lost. The database says so now: a second row with the same
-- (provider, id) is refused, and the delivery that tried to write it learns
-- that the candidate was not its own.
--
-- Rows that already share an id (written before this constraint) keep the id
-- on the one finished first; the others keep their frozen responses (a final
-- answer never changes) and lose only the column, with a note in their
-- events, so that receipts for that id reach one message.
WITH ranked AS (
    SELECT id, provider, provider_message_id,
        row_number() OVER (PARTITION BY provider, provider_message_id
                           ORDER BY finalized_at NULLS LAST, created_at, id) AS n
    FROM messages
    WHERE provider_message_id IS NOT NULL),
dropped AS (
    UPDATE messages m SET provider_message_id = NULL
    FROM ranked r
    WHERE m.id = r.id AND r.n > 1
    RETURNING m.id, m.provider, r.provider_message_id)
INSERT INTO message_events (id, message_id, at, kind, provider, to_provider, detail)
SELECT gen_random_uuid(), id, now(), 'provider_id_shared', provider, NULL,
    'provider message ' || provider_message_id || ' is held by an earlier message: '
    || 'removed from this one when ids became unique'
FROM dropped;

DROP INDEX IF EXISTS messages_provider_message_id_idx;
CREATE UNIQUE INDEX messages_provider_message_id_key ON messages (provider, provider_message_id)
    WHERE provider_message_id IS NOT NULL;

-- Who an attempt sent as (the provider's own words for its sender, e.g. a
-- Twilio `From` and messaging service), written when the attempt starts. A
-- reconciliation after a crash matches the provider's messages on the sender
-- the attempt used, not on whatever the instance that resumes it is
-- configured with. NULL on attempts made before this column existed (they
-- are matched on the current configuration, as before).
ALTER TABLE attempts ADD COLUMN sender text;
