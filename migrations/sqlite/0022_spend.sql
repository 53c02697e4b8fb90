-- Spend (issue 27). A message's estimated cost (segments × the price of
-- SENDONCE_PRICES) in integer micro-units of its currency; NULL for
-- messages stored before this migration and verification codes.
ALTER TABLE messages ADD COLUMN cost_micros INTEGER;
ALTER TABLE messages ADD COLUMN cost_currency TEXT;

-- A tenant's caps (NULL: none): micro-units per UTC day and month, and
-- messages per UTC day to countries other than home_country.
ALTER TABLE tenants ADD COLUMN spend_cap_daily_micros INTEGER;
ALTER TABLE tenants ADD COLUMN spend_cap_monthly_micros INTEGER;
ALTER TABLE tenants ADD COLUMN spend_cap_international_daily INTEGER;

-- What a capped tenant has spent per period (`d2026-12-02`, `m2026-12`):
-- updated in the transaction of each capped send's insert, by an UPDATE
-- whose condition is the cap, so the database decides races.
CREATE TABLE tenant_spend (
    tenant_id              BLOB NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    period                 TEXT NOT NULL,
    spent_micros           INTEGER NOT NULL DEFAULT 0,
    international_messages INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant_id, period)
);
