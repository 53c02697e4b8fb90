-- A tenant's home country (ISO 3166-1 alpha-2, set by `sendonce tenant
-- home-country NAME CC`): the console reads national-format numbers in it.
-- NULL: none set (only E.164 numbers are read).
ALTER TABLE tenants ADD COLUMN home_country TEXT;
