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
