-- Routes that react to measured quality (issue 43); see the Postgres
-- migration for the reasoning.
CREATE TABLE route_orders (
    prefix     TEXT PRIMARY KEY,
    providers  TEXT NOT NULL,
    pinned     INTEGER NOT NULL,
    reason     TEXT NOT NULL,
    changed_at INTEGER NOT NULL,
    version    INTEGER NOT NULL
);

ALTER TABLE messages ADD COLUMN route_order TEXT;
