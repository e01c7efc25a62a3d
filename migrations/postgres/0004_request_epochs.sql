-- The channel and epoch each agent request was applied under. Once the channel's epoch has
-- moved past it, a retry of the request is refused as stale whether or not its record is
-- there, so the record may go. Operators' requests (no channel) carry neither: kept.
ALTER TABLE requests ADD COLUMN channel TEXT;
ALTER TABLE requests ADD COLUMN epoch BIGINT;
-- Rows written before: applied under an epoch no later than the channel's epoch now.
UPDATE requests SET channel = substr(scope, 9) WHERE scope LIKE 'channel:%';
UPDATE requests SET epoch = (SELECT c.epoch FROM channels c WHERE c.channel = requests.channel)
    WHERE channel IS NOT NULL;
CREATE INDEX requests_by_channel_epoch ON requests (channel, epoch);
