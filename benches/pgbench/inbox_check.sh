#!/usr/bin/env bash
# The server-side cost of a CHECK constraint on the inbox's status (dropped by the second
# PostgreSQL migration): a PL/pgSQL procedure runs N transactions of an inbox delivery's
# writes — the record's insert, an effect, the stored result — against the inbox table with
# and without the constraint, interleaved, with `synchronous_commit = off` so that neither
# the network nor fsync is in the figure. Prints milliseconds per run.
# Usage: benches/pgbench/inbox_check.sh [transactions] [rounds]   (PGHOST etc. as for psql)
set -euo pipefail
n=${1:-20000}; rounds=${2:-6}
export PGHOST=${PGHOST:-127.0.0.1} PGUSER=${PGUSER:-postgres} PGDATABASE=${PGDATABASE:-test}
psql -q -c "DROP SCHEMA IF EXISTS idem_pgbench_check CASCADE" 2>/dev/null
psql -q <<'SQL'
DROP SCHEMA IF EXISTS idem_pgbench_check CASCADE;
CREATE SCHEMA idem_pgbench_check;
SET search_path TO idem_pgbench_check;
CREATE TABLE effects (request_key TEXT NOT NULL, body TEXT NOT NULL);
CREATE TABLE checked (
    consumer_group TEXT NOT NULL, message_key TEXT NOT NULL, fingerprint TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('PROCESSING', 'SUCCESS', 'FAILED', 'DEAD')),
    attempts BIGINT NOT NULL, result TEXT, error TEXT, lease_until BIGINT,
    created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL, PRIMARY KEY (consumer_group, message_key));
CREATE INDEX checked_updated_at ON checked (updated_at);
CREATE TABLE unchecked (LIKE checked INCLUDING INDEXES);
-- Static statements (planned once per session), one branch per table.
CREATE PROCEDURE deliver(n int, tbl text) LANGUAGE plpgsql AS $$
DECLARE k text;
BEGIN
  FOR i IN 1..n LOOP
    k := md5(i::text || random()::text);
    IF tbl = 'checked' THEN
      INSERT INTO checked (consumer_group, message_key, fingerprint, status, attempts, lease_until, created_at, updated_at)
        VALUES ('http', k, md5(k), 'SUCCESS', 1, NULL, i, i) ON CONFLICT (consumer_group, message_key) DO NOTHING;
      INSERT INTO effects (request_key, body) VALUES (k, 'body');
      UPDATE checked SET result = '{"created":4}' WHERE consumer_group = 'http' AND message_key = k;
    ELSE
      INSERT INTO unchecked (consumer_group, message_key, fingerprint, status, attempts, lease_until, created_at, updated_at)
        VALUES ('http', k, md5(k), 'SUCCESS', 1, NULL, i, i) ON CONFLICT (consumer_group, message_key) DO NOTHING;
      INSERT INTO effects (request_key, body) VALUES (k, 'body');
      UPDATE unchecked SET result = '{"created":4}' WHERE consumer_group = 'http' AND message_key = k;
    END IF;
    COMMIT;
  END LOOP;
END $$;
SQL
for round in $(seq "$rounds"); do
  for table in checked unchecked; do
    psql -q -c "TRUNCATE idem_pgbench_check.effects, idem_pgbench_check.checked, idem_pgbench_check.unchecked" -c "CHECKPOINT"
    printf '%-10s ' "$table"
    psql -qAt -c "SET synchronous_commit = off" -c "SET search_path TO idem_pgbench_check" -c '\timing on' \
      -c "CALL deliver($n, '$table')" | sed -n 's/^Time: \([0-9.]*\) ms.*/\1 ms/p'
  done
done
psql -q -c "DROP SCHEMA idem_pgbench_check CASCADE" 2>/dev/null
