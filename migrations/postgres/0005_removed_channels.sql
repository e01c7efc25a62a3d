-- The last epoch of every removed channel: an agent that registers for it again starts
-- above it, so a channel's epochs keep growing across a removal (fencing of the removed
-- incarnation, and the rule by which request records are pruned).
CREATE TABLE removed_channels (
    channel TEXT PRIMARY KEY,
    epoch   BIGINT NOT NULL CHECK (epoch >= 1)
);
