-- Test mode (issue 27): a tenant's test keys belong to a shadow tenant row
-- linked to its live tenant (see migrations/postgres/0024_test_mode.sql).
ALTER TABLE tenants ADD COLUMN live_tenant_id BLOB REFERENCES tenants (id) ON DELETE CASCADE;
CREATE UNIQUE INDEX tenants_live_tenant_key ON tenants (live_tenant_id);
