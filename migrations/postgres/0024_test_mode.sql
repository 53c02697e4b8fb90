-- Test mode (issue 27). A tenant's test keys (`so_test_`) belong to a
-- shadow tenant row linked to its live tenant, made with its first test
-- key. Every tenant-scoped table (messages, verifications, webhook events
-- and endpoints, opt-outs, console sessions) and the unique (tenant, key)
-- constraints then keep test data apart from live by themselves, and the
-- database still decides every race. The shadow keeps no settings of its
-- own: a key's lookup reads them, and `disabled`, from the live row (so
-- disabling a tenant stops its test keys too); its spend caps stay NULL
-- (test sends are never capped).
ALTER TABLE tenants ADD COLUMN live_tenant_id uuid REFERENCES tenants (id) ON DELETE CASCADE;
-- One shadow per live tenant (NULLs, the live tenants, do not collide).
CREATE UNIQUE INDEX tenants_live_tenant_key ON tenants (live_tenant_id);
