-- An event's deliveries, one per endpoint subscribed when the event is
-- written, are made by this trigger inside the statement that writes the
-- event: the same transaction as before, and one statement fewer for the
-- single writer per final write (each statement is a round trip to
-- SQLite's worker thread). Postgres does the same in the writing statement
-- itself (a CTE).
CREATE TRIGGER webhook_events_fan_out AFTER INSERT ON webhook_events
BEGIN
    INSERT INTO webhook_deliveries (event_id, endpoint_id, status, attempts,
        next_attempt_at, created_at, updated_at)
    SELECT NEW.id, w.id, 'pending', 0, NEW.created_at, NEW.created_at, NEW.created_at
    FROM webhook_endpoints w
    WHERE w.tenant_id = NEW.tenant_id AND w.enabled
      AND (w.events IS NULL OR EXISTS (SELECT 1 FROM json_each(w.events) j
           WHERE j.value = NEW.type));
END;
