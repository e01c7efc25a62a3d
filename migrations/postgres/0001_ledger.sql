-- The center's ledger. Counters are BIGINT and checked non-negative; the application
-- keeps total = available + sum(held) inside each transaction.

CREATE TABLE items (
    item_id            TEXT PRIMARY KEY,
    total              BIGINT NOT NULL CHECK (total >= 0),
    available          BIGINT NOT NULL CHECK (available >= 0 AND available <= total),
    per_user_limit     BIGINT NOT NULL CHECK (per_user_limit >= 1),
    reservation_ttl_ms BIGINT NOT NULL CHECK (reservation_ttl_ms >= 1),
    closed             BIGINT NOT NULL DEFAULT 0,
    wm_low             BIGINT NOT NULL,
    wm_high            BIGINT NOT NULL,
    wm_batch           BIGINT NOT NULL,
    created_at_ms      BIGINT NOT NULL
);

-- One row per channel: the fencing epoch and the lease.
CREATE TABLE channels (
    channel             TEXT PRIMARY KEY,
    epoch               BIGINT NOT NULL CHECK (epoch >= 1),
    agent_id            TEXT NOT NULL,
    lease_expires_at_ms BIGINT NOT NULL,
    last_heartbeat_ms   BIGINT NOT NULL
);

-- What each channel took from and gave back to the center, per item, and its last report.
CREATE TABLE allocations (
    item_id            TEXT NOT NULL REFERENCES items (item_id),
    channel            TEXT NOT NULL,
    granted            BIGINT NOT NULL DEFAULT 0 CHECK (granted >= 0),
    returned           BIGINT NOT NULL DEFAULT 0 CHECK (returned >= 0),
    reclaimed          BIGINT NOT NULL DEFAULT 0 CHECK (reclaimed >= 0),
    reported_available BIGINT NOT NULL DEFAULT 0,
    reported_reserved  BIGINT NOT NULL DEFAULT 0,
    reported_sold      BIGINT NOT NULL DEFAULT 0,
    reported_at_ms     BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (item_id, channel),
    CHECK (granted >= returned + reclaimed)
);

CREATE INDEX allocations_by_channel ON allocations (channel);

-- Per-channel watermark overrides; the item's default lives on the item row.
CREATE TABLE watermark_overrides (
    item_id TEXT NOT NULL REFERENCES items (item_id),
    channel TEXT NOT NULL,
    low     BIGINT NOT NULL,
    high    BIGINT NOT NULL,
    batch   BIGINT NOT NULL,
    PRIMARY KEY (item_id, channel)
);

-- Exactly-once: the first answer to every request id, per caller scope.
CREATE TABLE requests (
    scope         TEXT NOT NULL,
    request_id    TEXT NOT NULL,
    fingerprint   TEXT NOT NULL,
    response      TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    PRIMARY KEY (scope, request_id)
);
