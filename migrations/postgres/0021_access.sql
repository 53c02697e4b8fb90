-- Issue 27: scoped API keys, an admin API with an audit log, disabled
-- tenants.

-- A key's scopes, comma-separated (src/scopes.rs): every key already issued
-- keeps what it could do before (everything but `admin`); the bootstrap key
-- also administers.
ALTER TABLE api_keys ADD COLUMN scopes text NOT NULL DEFAULT 'send,read,opt-outs,webhooks';
UPDATE api_keys SET scopes = 'send,read,opt-outs,webhooks,admin' WHERE bootstrap;
ALTER TABLE api_keys ADD COLUMN label text;
-- Written at most once a minute per key and instance (the key cache decides).
ALTER TABLE api_keys ADD COLUMN last_used_at timestamptz;

-- A disabled tenant's keys are refused (401 `tenant-disabled`).
ALTER TABLE tenants ADD COLUMN disabled boolean NOT NULL DEFAULT false;

-- The last-used time is not something an instance caches: writing it must
-- not drop every instance's cached keys of the tenant once a minute.
DROP TRIGGER api_keys_notify ON api_keys;
CREATE TRIGGER api_keys_notify AFTER INSERT OR DELETE
    OR UPDATE OF tenant_id, key_hash, revoked_at, scopes, label ON api_keys
    FOR EACH ROW EXECUTE FUNCTION sendonce_notify_tenant();

-- What the admin API and the CLI changed, written in the change's own
-- transaction. `key_id`/`key_label`: the acting key (NULL from the CLI).
CREATE TABLE audit_log (
    id         uuid PRIMARY KEY,          -- UUIDv7: newest first is id order
    at         timestamptz NOT NULL,
    actor      text NOT NULL,             -- 'api' or 'cli'
    key_id     uuid,
    key_label  text,
    action     text NOT NULL,             -- e.g. tenant.create, key.revoke
    target     text NOT NULL,             -- the tenant name or key id
    detail     text NOT NULL              -- JSON: what was set
);
