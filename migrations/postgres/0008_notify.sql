-- Change notifications for the instances' in-process caches (see
-- src/notify.rs). Sent in the same transaction as the change, by triggers, so
-- every writer (the service, the CLI, a manual UPDATE) is covered and a
-- rolled-back change notifies nobody.

-- A tenant's settings or one of its API keys changed: every instance drops
-- the tenant's cached keys (revocation takes effect at once).
CREATE FUNCTION sendonce_notify_tenant() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_TABLE_NAME = 'tenants' THEN
        PERFORM pg_notify('sendonce', 'tenant:' || COALESCE(NEW.id, OLD.id)::text);
    ELSE
        PERFORM pg_notify('sendonce', 'tenant:' || COALESCE(NEW.tenant_id, OLD.tenant_id)::text);
        IF TG_OP = 'UPDATE' AND NEW.tenant_id IS DISTINCT FROM OLD.tenant_id THEN
            PERFORM pg_notify('sendonce', 'tenant:' || OLD.tenant_id::text);
        END IF;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER tenants_notify AFTER UPDATE OR DELETE ON tenants
    FOR EACH ROW EXECUTE FUNCTION sendonce_notify_tenant();
CREATE TRIGGER api_keys_notify AFTER INSERT OR UPDATE OR DELETE ON api_keys
    FOR EACH ROW EXECUTE FUNCTION sendonce_notify_tenant();

-- Messages were deleted (the retention purge): every instance drops cached
-- final responses of messages created up to the newest one deleted, so a
-- purged key is new again everywhere. One notification per statement.
CREATE FUNCTION sendonce_notify_purged() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    newest timestamptz;
BEGIN
    SELECT max(created_at) INTO newest FROM purged;
    IF newest IS NOT NULL THEN
        PERFORM pg_notify('sendonce',
            'purged:' || floor(extract(epoch FROM newest) * 1000000)::bigint::text);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER messages_notify_purged AFTER DELETE ON messages
    REFERENCING OLD TABLE AS purged
    FOR EACH STATEMENT EXECUTE FUNCTION sendonce_notify_purged();
