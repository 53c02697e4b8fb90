-- The console's message timeline finds a message's webhook events and each
-- delivery's attempts: without these it would read every event the tenant
-- keeps (up to retention) and every attempt of the endpoint.
CREATE INDEX webhook_events_message ON webhook_events (message_id) WHERE message_id IS NOT NULL;
CREATE INDEX webhook_attempts_delivery ON webhook_attempts (delivery_id);
