-- Hardening II (issue 18): bootstrap key rotation, per-tenant senders and
-- the oldest-`processing` query.

-- The key SENDONCE_BOOTSTRAP_API_KEY put in. When the configured value
-- changes, the previous bootstrap key is revoked; keys made with
-- `sendonce key create` are never flagged and never touched by it.
ALTER TABLE api_keys ADD COLUMN bootstrap boolean NOT NULL DEFAULT false;

-- The senders (`from`) a tenant may use, E.164 numbers or alphanumeric ids.
-- NULL: no list (the provider's default sender only; tenant `default`
-- accepts any sender until a list is set).
ALTER TABLE tenants ADD COLUMN allowed_senders text[];

-- `min(created_at) WHERE status = 'processing'` (the oldest-processing
-- gauge) reads the first entry of this small index instead of every row.
CREATE INDEX messages_processing_created_idx ON messages (created_at)
    WHERE status = 'processing';
