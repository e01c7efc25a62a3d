-- The pruner deletes agents' request records by age as well as by epoch.
CREATE INDEX requests_by_age ON requests (created_at_ms);
