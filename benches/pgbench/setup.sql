-- The tables of benches/pgbench/run.sh, in their own schema.
DROP SCHEMA IF EXISTS idem_pgbench CASCADE;
CREATE SCHEMA idem_pgbench;
SET search_path TO idem_pgbench;
CREATE TABLE orders (order_id BIGINT PRIMARY KEY, status TEXT NOT NULL, version BIGINT NOT NULL DEFAULT 0);
CREATE TABLE payments (id BIGSERIAL PRIMARY KEY, order_id BIGINT NOT NULL, amount BIGINT NOT NULL);
CREATE TABLE idem_results (machine TEXT NOT NULL, entity_key TEXT NOT NULL, from_state TEXT NOT NULL,
    to_state TEXT NOT NULL, result TEXT NOT NULL, created_at TIMESTAMPTZ NOT NULL DEFAULT CURRENT_TIMESTAMP,
    PRIMARY KEY (machine, entity_key, from_state, to_state));
INSERT INTO orders SELECT g, 'CREATED', 0 FROM generate_series(1, 100000) g;
ANALYZE;
