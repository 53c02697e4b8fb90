-- Issue 27: scoped API keys, an admin API with an audit log, disabled
-- tenants (see migrations/postgres/0021_access.sql).

ALTER TABLE api_keys ADD COLUMN scopes TEXT NOT NULL DEFAULT 'send,read,opt-outs,webhooks';
UPDATE api_keys SET scopes = 'send,read,opt-outs,webhooks,admin' WHERE bootstrap;
ALTER TABLE api_keys ADD COLUMN label TEXT;
ALTER TABLE api_keys ADD COLUMN last_used_at INTEGER;

ALTER TABLE tenants ADD COLUMN disabled INTEGER NOT NULL DEFAULT 0;

CREATE TABLE audit_log (
    id         BLOB PRIMARY KEY,
    at         INTEGER NOT NULL,
    actor      TEXT NOT NULL,
    key_id     BLOB,
    key_label  TEXT,
    action     TEXT NOT NULL,
    target     TEXT NOT NULL,
    detail     TEXT NOT NULL
);
