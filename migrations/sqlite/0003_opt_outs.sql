-- Per-tenant destination country allow-list and opt-out list (see the
-- Postgres migration for the reasoning).

-- NULL: every country. Otherwise comma-separated ISO codes, e.g. US,CA.
ALTER TABLE tenants ADD COLUMN allowed_countries TEXT;

CREATE TABLE opt_outs (
    tenant_id   BLOB NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    number      TEXT NOT NULL,
    source      TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, number)
);
