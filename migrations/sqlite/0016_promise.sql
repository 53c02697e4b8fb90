-- Keeping the promise (issue 24). See migrations/postgres/0016_promise.sql
-- for why each change is made.

-- A provider's message id belongs to one message: rows that already share
-- one keep it on the one finished first.
INSERT INTO message_events (id, message_id, at, kind, provider, to_provider, detail)
SELECT randomblob(16), m.id, CAST(unixepoch('subsec') * 1000000 AS INTEGER),
    'provider_id_shared', m.provider, NULL,
    'provider message ' || m.provider_message_id || ' is held by an earlier message: '
    || 'removed from this one when ids became unique'
FROM messages m
WHERE m.provider_message_id IS NOT NULL
  AND EXISTS (SELECT 1 FROM messages o
              WHERE o.provider = m.provider AND o.provider_message_id = m.provider_message_id
                AND o.id <> m.id
                AND (COALESCE(o.finalized_at, 9223372036854775807), o.created_at, o.id)
                    < (COALESCE(m.finalized_at, 9223372036854775807), m.created_at, m.id));

UPDATE messages SET provider_message_id = NULL
WHERE provider_message_id IS NOT NULL
  AND EXISTS (SELECT 1 FROM messages o
              WHERE o.provider = messages.provider
                AND o.provider_message_id = messages.provider_message_id
                AND o.id <> messages.id
                AND (COALESCE(o.finalized_at, 9223372036854775807), o.created_at, o.id)
                    < (COALESCE(messages.finalized_at, 9223372036854775807),
                       messages.created_at, messages.id));

DROP INDEX IF EXISTS messages_provider_message_id_idx;
CREATE UNIQUE INDEX messages_provider_message_id_key ON messages (provider, provider_message_id)
    WHERE provider_message_id IS NOT NULL;

-- Who an attempt sent as, written when the attempt starts.
ALTER TABLE attempts ADD COLUMN sender TEXT;
