-- A verification's channels in any order, one step at a time (issue 40);
-- see migrations/postgres/0027_channel_steps.sql. SQLite cannot change a
-- primary key: the table is made anew with its rows.
CREATE TABLE verification_fallbacks_new (
    verification_id BLOB NOT NULL REFERENCES verifications (id) ON DELETE CASCADE,
    send_number     INTEGER NOT NULL,
    step            INTEGER NOT NULL DEFAULT 0,
    tenant_id       BLOB NOT NULL,
    message_id      BLOB NOT NULL REFERENCES messages (id) ON DELETE CASCADE,
    due_at          INTEGER NOT NULL,
    state           TEXT NOT NULL,
    updated_at      INTEGER NOT NULL,
    PRIMARY KEY (verification_id, send_number, step),
    CONSTRAINT verification_fallbacks_state_check CHECK (state IN
        ('waiting', 'delivered', 'fell_back', 'ended'))
);
INSERT INTO verification_fallbacks_new (verification_id, send_number, step, tenant_id,
        message_id, due_at, state, updated_at)
    SELECT verification_id, send_number, 0, tenant_id, message_id, due_at, state, updated_at
    FROM verification_fallbacks;
DROP TABLE verification_fallbacks;
ALTER TABLE verification_fallbacks_new RENAME TO verification_fallbacks;
CREATE INDEX verification_fallbacks_open ON verification_fallbacks (due_at)
    WHERE state IN ('waiting', 'delivered');

ALTER TABLE verifications ADD COLUMN fallback_after_list TEXT;
