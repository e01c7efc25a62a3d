-- Run once by the postgres image when its volume is first initialised
-- (/docker-entrypoint-initdb.d): the order sink's database, apart from the center's ledger.
-- order-sink creates its tables (orders, order_events_seen) itself.
CREATE DATABASE orders OWNER inventory;
