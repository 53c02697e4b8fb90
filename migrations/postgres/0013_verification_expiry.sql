-- The expiry sweep (verify/expiry.rs) looks for pending verifications whose
-- time ran out; only pending ones are in this index, so the sweep reads
-- nothing else however many verifications retention keeps.
CREATE INDEX verifications_pending_expiry ON verifications (expires_at) WHERE status = 'pending';
