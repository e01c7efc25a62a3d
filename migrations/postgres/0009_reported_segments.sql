-- A segmented pool's segments as the channel last reported them (core::segments::encode;
-- '' for one pool), shown by the console.
ALTER TABLE allocations ADD COLUMN reported_segments TEXT NOT NULL DEFAULT '';
