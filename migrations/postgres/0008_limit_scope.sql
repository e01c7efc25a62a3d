-- Global per-user limits: where an item's per_user_limit applies (0 = each channel,
-- 1 = over all channels, kept in the buyer registry) and what agents do when the registry
-- is unreachable (0 = refuse, 1 = fall back to the per-channel limit).
ALTER TABLE items ADD COLUMN limit_scope BIGINT NOT NULL DEFAULT 0;
ALTER TABLE items ADD COLUMN registry_fallback BIGINT NOT NULL DEFAULT 0;
