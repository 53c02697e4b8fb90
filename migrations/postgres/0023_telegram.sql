-- Telegram bot updates taken (issue 28): one row per (bot, update_id), so
-- that an update Telegram delivers again (it re-sends every update that did
-- not get a 2xx, for up to 24 hours) is taken once. Kept for at least 7
-- days; an id whose row is older than that is a new update (Telegram's ids
-- restart at a random value after a quiet week), never compared as a
-- high-water mark. Purged with the retention machinery after 7 days.
CREATE TABLE telegram_updates (
    bot_id      bigint NOT NULL,
    update_id   bigint NOT NULL,
    received_at timestamptz NOT NULL,
    PRIMARY KEY (bot_id, update_id)
);
CREATE INDEX telegram_updates_received_at ON telegram_updates (received_at);
