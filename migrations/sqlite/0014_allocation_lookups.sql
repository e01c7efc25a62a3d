-- A heartbeat reads and writes its channel's rows a few hundred items at a time. Found by
-- channel and item, a chunk reads its own rows whichever index the planner picks (by
-- channel alone it read every row of the channel, when the table's statistics lagged
-- behind its growth: quadratic in the channel's items).
DROP INDEX allocations_by_channel;
CREATE INDEX allocations_by_channel ON allocations (channel, item_id);
-- Every heartbeat answers the items its channel holds in doubt: rare rows, found without
-- reading every allocation of the channel.
CREATE INDEX allocations_in_doubt ON allocations (channel) WHERE in_doubt > 0;
