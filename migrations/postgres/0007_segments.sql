-- Segmented stock: how many pool segments each channel keeps of an item (1: one pool).
ALTER TABLE items ADD COLUMN segments BIGINT NOT NULL DEFAULT 1;
