-- Whether the channel's last report was its agent's last word (it drained): a Reclaim may
-- then put the unreported units back on sale; otherwise they go in doubt.
ALTER TABLE channels ADD COLUMN last_report BIGINT NOT NULL DEFAULT 0;
