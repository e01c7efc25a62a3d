-- The highest write sequence each channel reported per pool segment (segment 0 for an
-- unsegmented pool): handed back to the channel's agent as the pool's floor, so a pool
-- store that went back in time is caught even after the agent restarted. Only raised
-- (core::pool::remember_write_seq; the upsert's WHERE), never lowered.
CREATE TABLE pool_write_seqs (
    item_id   TEXT NOT NULL,
    channel   TEXT NOT NULL,
    segment   BIGINT NOT NULL,
    write_seq BIGINT NOT NULL,
    PRIMARY KEY (channel, item_id, segment)
);
