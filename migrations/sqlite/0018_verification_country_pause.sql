-- The SMS-pumping defence also judges a destination country's recent
-- verifications, all its prefixes together (a start counts them by
-- tenant, country and time, as it counts a prefix's by the index of 0009).
-- The country's pause is a verify_pauses row keyed `country:<ISO code>`.
CREATE INDEX verifications_country_idx ON verifications (tenant_id, country, created_at);
