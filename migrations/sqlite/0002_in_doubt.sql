-- Data loss in a channel's pool store: the generation the channel last reported, units
-- in doubt until resolved, and units written off as sold outside the pools.
ALTER TABLE allocations ADD COLUMN pool_generation INTEGER NOT NULL DEFAULT 0;
ALTER TABLE allocations ADD COLUMN in_doubt INTEGER NOT NULL DEFAULT 0 CHECK (in_doubt >= 0);
ALTER TABLE items ADD COLUMN written_off INTEGER NOT NULL DEFAULT 0 CHECK (written_off >= 0);
