-- The database floor, what Postgres alone does for one new send on the
-- critical path, as a pgbench script (run with -M prepared, as sqlx prepares
-- and caches its statements). The four statements are those of
-- src/store/postgres.rs, tenant_for_key (authentication), insert_message
-- (the claiming insert with attempt 1 started and the lease held, which also
-- reads the opt-out list), finish (the fenced final write that closes
-- attempt 1) and has_unmatched_receipts (the look for receipts that overtook
-- the send, made after the final write). Values the service
-- binds as parameters are pgbench variables here, set with -D by the load
-- generator or by gset from the statement before; times are now().
-- Keep in step with src/store/postgres.rs. (No colons or backslashes in
-- these comments, pgbench would read them as variables or commands.)

\set n random(1, 9000000000000000000)

SELECT k.tenant_id, t.allowed_countries IS NULL AS unrestricted FROM api_keys k
    JOIN tenants t ON t.id = k.tenant_id
    WHERE k.key_hash = :keyhash AND k.revoked_at IS NULL \gset

WITH ins AS (
    INSERT INTO messages (id, tenant_id, idempotency_key, fingerprint, status,
        to_number, from_sender, body, segments, encoding, metadata,
        validity_seconds, provider, attempts, lease_token, lease_owner,
        lease_expires_at, created_at, updated_at, expires_at, deadline_at)
    VALUES (gen_random_uuid(), :tenant_id, 'FLOOR-' || :client_id::text || '-' || :n::text,
        :fingerprint, 'processing', :to, NULL, :body, 1, 'gsm7', '{}'::jsonb, NULL, 'http', 1,
        gen_random_uuid(), :owner, now() + interval '30 seconds', now(), now(), NULL,
        now() + interval '900 seconds')
    ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
    RETURNING id, lease_token),
att AS (
    INSERT INTO attempts (message_id, number, lease_owner, started_at)
    SELECT id, 1, :owner, now() FROM ins),
res AS (
SELECT true AS created, ins.id AS message_id, ins.lease_token, NULL::bytea AS fingerprint,
    NULL::text AS status, NULL::smallint AS response_code, NULL::bytea AS response_body,
    EXISTS (SELECT 1 FROM opt_outs o WHERE o.tenant_id = :tenant_id AND o.number = :to) AS opted_out
FROM ins
UNION ALL
SELECT false, m.id, m.lease_token, m.fingerprint, m.status, m.response_code, m.response_body, false
FROM messages m
WHERE m.tenant_id = :tenant_id AND m.idempotency_key = 'FLOOR-' || :client_id::text || '-' || :n::text
    AND NOT EXISTS (SELECT 1 FROM ins))
SELECT message_id, lease_token, opted_out FROM res \gset

WITH m AS (
    UPDATE messages SET status = 'sent', provider_message_id = ('mock_' || :message_id::text),
        error = NULL, sent_at = now(), updated_at = now(), finalized_at = now(),
        response_code = 201, response_body = :response, lease_token = NULL,
        lease_owner = NULL, lease_expires_at = NULL, next_attempt_at = NULL
    WHERE id = :message_id AND lease_token = :lease_token AND status = 'processing'
    RETURNING id),
a AS (
    UPDATE attempts SET finished_at = now(), outcome = 'sent', http_status = 200,
        provider_code = NULL, error = NULL, provider_message_id = ('mock_' || :message_id::text)
    WHERE message_id = (SELECT id FROM m) AND number = 1 AND finished_at IS NULL)
SELECT count(*) FROM m;

SELECT EXISTS (SELECT 1 FROM receipts
    WHERE provider = 'http' AND provider_message_id = ('mock_' || :message_id::text) AND message_id IS NULL);
