-- The center's ledger (SQLite dialect). Counters are INTEGER and checked
-- non-negative; the application keeps total = available + sum(held) inside each transaction.

CREATE TABLE items (
    item_id            TEXT PRIMARY KEY,
    total              INTEGER NOT NULL CHECK (total >= 0),
    available          INTEGER NOT NULL CHECK (available >= 0 AND available <= total),
    per_user_limit     INTEGER NOT NULL CHECK (per_user_limit >= 1),
    reservation_ttl_ms INTEGER NOT NULL CHECK (reservation_ttl_ms >= 1),
    closed             INTEGER NOT NULL DEFAULT 0,
    wm_low             INTEGER NOT NULL,
    wm_high            INTEGER NOT NULL,
    wm_batch           INTEGER NOT NULL,
    created_at_ms      INTEGER NOT NULL
);

-- One row per channel: the fencing epoch and the lease.
CREATE TABLE channels (
    channel             TEXT PRIMARY KEY,
    epoch               INTEGER NOT NULL CHECK (epoch >= 1),
    agent_id            TEXT NOT NULL,
    lease_expires_at_ms INTEGER NOT NULL,
    last_heartbeat_ms   INTEGER NOT NULL
);

-- What each channel took from and gave back to the center, per item, and its last report.
CREATE TABLE allocations (
    item_id            TEXT NOT NULL REFERENCES items (item_id),
    channel            TEXT NOT NULL,
    granted            INTEGER NOT NULL DEFAULT 0 CHECK (granted >= 0),
    returned           INTEGER NOT NULL DEFAULT 0 CHECK (returned >= 0),
    reclaimed          INTEGER NOT NULL DEFAULT 0 CHECK (reclaimed >= 0),
    reported_available INTEGER NOT NULL DEFAULT 0,
    reported_reserved  INTEGER NOT NULL DEFAULT 0,
    reported_sold      INTEGER NOT NULL DEFAULT 0,
    reported_at_ms     INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (item_id, channel),
    CHECK (granted >= returned + reclaimed)
);

CREATE INDEX allocations_by_channel ON allocations (channel);

-- Per-channel watermark overrides; the item's default lives on the item row.
CREATE TABLE watermark_overrides (
    item_id TEXT NOT NULL REFERENCES items (item_id),
    channel TEXT NOT NULL,
    low     INTEGER NOT NULL,
    high    INTEGER NOT NULL,
    batch   INTEGER NOT NULL,
    PRIMARY KEY (item_id, channel)
);

-- Exactly-once: the first answer to every request id, per caller scope.
CREATE TABLE requests (
    scope         TEXT NOT NULL,
    request_id    TEXT NOT NULL,
    fingerprint   TEXT NOT NULL,
    response      TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL,
    PRIMARY KEY (scope, request_id)
);
