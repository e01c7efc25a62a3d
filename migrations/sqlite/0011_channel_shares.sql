-- The operator's plan per channel (CreateItem.channel_shares): each channel's weight in the
-- opening allocation, the most it may hold (cap, 0: none) and the units the center keeps
-- for it while it sells (floor). JSON, an array of {channel, weight, cap_units,
-- floor_units} sorted by channel; '' when the item has no shares (even split, no caps).
-- Read with the item's row, under the same lock as every Borrow of the item.
ALTER TABLE items ADD COLUMN channel_shares TEXT NOT NULL DEFAULT '';
