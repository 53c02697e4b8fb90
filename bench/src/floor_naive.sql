-- The naive floor, the fixed reference the benchmark tracks sendonce
-- against: what a careful but plain implementation does per message on
-- Postgres, one statement and one commit to claim the key, one to record
-- the final answer. It does not move with sendonce's own design (no attempt
-- rows, no leases renewed, no opt-out check, no receipts), so a better
-- sendonce shows as a better ratio. Run with -M prepared; the tenant and the
-- other values are pgbench variables set with -D by the load generator.
-- (No colons or backslashes in these comments, pgbench would read them as
-- variables or commands.)

\set n random(1, 9000000000000000000)

INSERT INTO messages (id, tenant_id, idempotency_key, fingerprint, status, to_number,
    body, segments, encoding, provider, attempts, lease_token, lease_owner,
    lease_expires_at, created_at, updated_at, deadline_at)
VALUES (gen_random_uuid(), :tenant_id, 'NAIVE-' || :client_id::text || '-' || :n::text,
    :fingerprint, 'processing', :to, :body, 1, 'gsm7', 'http', 1, gen_random_uuid(), :owner,
    now() + interval '30 seconds', now(), now(), now() + interval '900 seconds')
ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
RETURNING id AS message_id \gset

UPDATE messages SET status = 'sent', provider_message_id = ('mock_' || :message_id::text),
    sent_at = now(), updated_at = now(), finalized_at = now(), response_code = 201,
    response_body = :response, lease_token = NULL, lease_owner = NULL,
    lease_expires_at = NULL
WHERE id = :message_id;
