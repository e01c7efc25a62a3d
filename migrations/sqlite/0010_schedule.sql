-- The plan of a sale: when the item opens and closes (milliseconds since 1970 by the
-- center's clock; 0: open from creation, no end), how long before the opening the
-- channels stock their pools, and the units the center keeps back from the opening stock.
ALTER TABLE items ADD COLUMN opens_at_ms BIGINT NOT NULL DEFAULT 0;
ALTER TABLE items ADD COLUMN closes_at_ms BIGINT NOT NULL DEFAULT 0;
ALTER TABLE items ADD COLUMN prestock_lead_ms BIGINT NOT NULL DEFAULT 30000;
ALTER TABLE items ADD COLUMN center_reserve BIGINT NOT NULL DEFAULT 0;
-- The closer looks for open items whose end has come, every quarter second.
CREATE INDEX items_closing ON items (closes_at_ms) WHERE closes_at_ms > 0 AND closed = 0;
