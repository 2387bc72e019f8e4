#!/usr/bin/env bash
# The cost of `idem::enforce` on an applied transition, with pgbench (prepared statements):
# the same UPDATE of the state column and an insert, in one transaction, with and without
# the CHECK and the trigger `Order::IDEM_SQL.of(idem::Dialect::Postgres).enforce` installs, interleaved. The
# UPDATE moves every row along a declared edge (CREATED <-> PAID, both declared here, so
# the rows keep moving), as idem's transitions do.
# Usage: benches/pgbench/enforce.sh [clients] [seconds] [rounds]   (PGHOST etc. as for psql)
set -euo pipefail
cd "$(dirname "$0")"
clients=${1:-8}; seconds=${2:-6}; rounds=${3:-5}
export PGHOST=${PGHOST:-127.0.0.1} PGUSER=${PGUSER:-postgres} PGDATABASE=${PGDATABASE:-test}
run() { printf '%-10s c%-3s ' "$1" "$clients"
        pgbench -n -M prepared -c "$clients" -j "$(( clients < 2 ? 1 : 2 ))" -T "$seconds" -f enforce_applied.sql 2>/dev/null \
          | sed -n 's/^tps = \([0-9.]*\).*/\1 tps/p'; }
enforce() { psql -q <<'SQL'
SET search_path TO idem_pgbench;
ALTER TABLE orders ADD CONSTRAINT idem_orders_status_declared
    CHECK (CAST(status AS TEXT) IN ('CREATED', 'PAID', 'SHIPPED', 'CANCELLED'));
CREATE OR REPLACE FUNCTION idem_orders_status_edges() RETURNS trigger LANGUAGE plpgsql AS $idem$
BEGIN
    IF CAST(NEW.status AS TEXT) IS DISTINCT FROM CAST(OLD.status AS TEXT)
       AND (CAST(OLD.status AS TEXT), CAST(NEW.status AS TEXT)) NOT IN (('CREATED', 'PAID'), ('PAID', 'CREATED'), ('CREATED', 'CANCELLED'), ('PAID', 'SHIPPED')) THEN
        RAISE EXCEPTION 'idem: % -> % is not a transition of the state machine Order', CAST(OLD.status AS TEXT), CAST(NEW.status AS TEXT)
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$idem$;
CREATE TRIGGER idem_orders_status_edges BEFORE UPDATE OF status ON orders
    FOR EACH ROW EXECUTE FUNCTION idem_orders_status_edges();
SQL
}
plain() { psql -q -c "DROP TRIGGER IF EXISTS idem_orders_status_edges ON idem_pgbench.orders" \
               -c "ALTER TABLE idem_pgbench.orders DROP CONSTRAINT IF EXISTS idem_orders_status_declared"; }
psql -q -f setup.sql
for round in $(seq "$rounds"); do plain; run plain; enforce; run enforced; done
psql -q -c "DROP SCHEMA idem_pgbench CASCADE"
