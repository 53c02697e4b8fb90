-- Per-tenant destination country allow-list and opt-out list.

-- NULL: every country. Otherwise ISO 3166-1 alpha-2 codes, e.g. {US,CA}.
ALTER TABLE tenants ADD COLUMN allowed_countries text[];

-- Numbers that asked not to be messaged (STOP), per tenant. A send to one
-- of them ends `failed` with `recipient_opted_out` and never reaches the
-- provider. The primary key makes adding an opt-out idempotent.
CREATE TABLE opt_outs (
    tenant_id   uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    number      text NOT NULL,          -- E.164
    source      text NOT NULL,          -- api | inbound
    created_at  timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, number)
);
