-- The verification a message carries a code of (issue 39); see
-- migrations/postgres/0026_verification_messages.sql.
ALTER TABLE messages ADD COLUMN verification_id BLOB;
CREATE INDEX messages_verification_id ON messages (verification_id)
    WHERE verification_id IS NOT NULL;
