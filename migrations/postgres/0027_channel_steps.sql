-- A verification's channels in any order, one step at a time (issue 40).
--
-- Every step's message of a verification with more than the default channel
-- has a row, written in the transaction that inserts the message; rows of
-- the same send are told apart by their step (0: the first channel).
ALTER TABLE verification_fallbacks ADD COLUMN step integer NOT NULL DEFAULT 0;
ALTER TABLE verification_fallbacks DROP CONSTRAINT verification_fallbacks_pkey;
ALTER TABLE verification_fallbacks ADD PRIMARY KEY (verification_id, send_number, step);

-- How long each step waits for a delivery report before the next, one per
-- step after the first, joined by ','; NULL: fallback_after_seconds for
-- every step.
ALTER TABLE verifications ADD COLUMN fallback_after_list text;

-- Inbound updates of every channel of its own, not only the Telegram bot's
-- (issue 40): taken once under (channel, source, event id).
ALTER TABLE telegram_updates RENAME TO inbound_updates;
ALTER TABLE inbound_updates RENAME COLUMN bot_id TO source;
ALTER TABLE inbound_updates RENAME COLUMN update_id TO event_id;
ALTER TABLE inbound_updates ADD COLUMN channel text NOT NULL DEFAULT 'telegram';
ALTER TABLE inbound_updates DROP CONSTRAINT telegram_updates_pkey;
ALTER TABLE inbound_updates ADD PRIMARY KEY (channel, source, event_id);
ALTER INDEX telegram_updates_received_at RENAME TO inbound_updates_received_at;

-- A tenant's default channels for a verification that names none
-- (`verify_channels`, joined by ','); NULL: `sms` alone.
ALTER TABLE tenants ADD COLUMN verify_channels text;

-- Our id of the message a receipt names, when the provider echoed it under
-- its authentication (WhatsApp's biz_opaque_callback_data, Vonage's
-- client-ref): a status that comes while the message is still being sent,
-- and whose answer never gives us the provider's id (an ambiguous send),
-- stays unlinked, and this is how a verification's next step still sees
-- that it was delivered (issue 40).
ALTER TABLE receipts ADD COLUMN our_message_id uuid;
CREATE INDEX receipts_our_message_idx ON receipts (our_message_id)
    WHERE our_message_id IS NOT NULL;
