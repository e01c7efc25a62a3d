-- Rate-following batches: whether an item's pools size their batches by their sell rate,
-- within which bounds (0 = off), and each channel's last reported sell rate of the item
-- (units per second x 1000), by which the center shares a short supply.
ALTER TABLE items ADD COLUMN rate_batching BIGINT NOT NULL DEFAULT 0;
ALTER TABLE items ADD COLUMN rate_min_batch BIGINT NOT NULL DEFAULT 0;
ALTER TABLE items ADD COLUMN rate_max_batch BIGINT NOT NULL DEFAULT 0;
ALTER TABLE items ADD COLUMN rate_target_ms BIGINT NOT NULL DEFAULT 0;
ALTER TABLE allocations ADD COLUMN sell_rate_milli BIGINT NOT NULL DEFAULT 0;
