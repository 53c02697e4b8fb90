-- Routes that react to measured quality (issue 43).
--
-- The order of a route's providers as quality (or an operator's pin) set
-- it: one row per route prefix that was ever shifted or pinned; a route
-- without a row takes SENDONCE_ROUTES' order. Changed only by
-- compare-and-set on `version`, in the transaction that writes the change's
-- audit row, so two instances never both shift a route and every shift has
-- its reason on record.
CREATE TABLE route_orders (
    prefix     text PRIMARY KEY,
    -- The providers, in order, joined by ','.
    providers  text NOT NULL,
    pinned     boolean NOT NULL,
    reason     text NOT NULL,
    changed_at timestamptz NOT NULL,
    version    bigint NOT NULL
);

-- The order of providers a message takes when it is not its route's
-- configured one (a shifted order, or a message that keeps a demoted
-- provider measured): its failover follows it. NULL: the route's order.
ALTER TABLE messages ADD COLUMN route_order text;
