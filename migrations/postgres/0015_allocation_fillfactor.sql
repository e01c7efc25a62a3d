-- Every heartbeat rewrites its channel's report columns, none of them indexed: room left
-- on each page lets PostgreSQL update such a row in place (a heap-only tuple), without a
-- new entry in each of the table's indexes. Pages written from now on keep the room.
ALTER TABLE allocations SET (fillfactor = 70);
