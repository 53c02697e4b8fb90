-- Issue 15: scheduled sends and cancel.
--
-- `scheduled`: due at `next_attempt_at` (the requested `send_at`, or the end
-- of a quiet window), no lease, no attempt yet; any instance's scheduler
-- claims it when due, which makes it `processing` under a lease.
-- `canceled`: final, with its frozen response like every final status.
-- `send_at` records what the request asked for (after "a past time is now").

ALTER TABLE messages ADD COLUMN send_at timestamptz;

ALTER TABLE messages DROP CONSTRAINT messages_status_check;
ALTER TABLE messages ADD CONSTRAINT messages_status_check CHECK (status IN
    ('scheduled', 'processing', 'sent', 'failed', 'unknown', 'delivered', 'undelivered',
     'canceled'));

ALTER TABLE messages DROP CONSTRAINT messages_final_has_response;
ALTER TABLE messages ADD CONSTRAINT messages_final_has_response CHECK (
    status IN ('processing', 'scheduled')
    OR (response_code IS NOT NULL AND response_body IS NOT NULL));

ALTER TABLE messages ADD CONSTRAINT messages_scheduled_is_due_and_free CHECK (
    status <> 'scheduled' OR (next_attempt_at IS NOT NULL AND lease_token IS NULL));

CREATE INDEX messages_scheduled_idx ON messages (next_attempt_at) WHERE status = 'scheduled';

-- Quiet hours: a tenant's daily window (`21:00-08:00`) in the recipient's
-- local time; NULL is none.
ALTER TABLE tenants ADD COLUMN quiet_hours text;
