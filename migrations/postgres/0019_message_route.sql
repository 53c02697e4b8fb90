-- Routes by destination (SENDONCE_ROUTES): the prefix of the route a
-- message's number took, shown on the message; NULL when not routed.
ALTER TABLE messages ADD COLUMN route TEXT;
