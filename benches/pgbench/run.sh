#!/usr/bin/env bash
# The server-side cost of PostgreSQL's two classification forms, with pgbench (a C client,
# prepared statements), so the Rust client's own cost is out of the picture:
#   applied_*: a transition that applies (the row stays CREATED so every run applies);
#   miss_*:    a transition that misses (every row PAID): two statements or one.
# Usage: benches/pgbench/run.sh [clients] [seconds]   (PGHOST etc. as for psql)
set -euo pipefail
cd "$(dirname "$0")"
clients=${1:-8}; seconds=${2:-6}
export PGHOST=${PGHOST:-127.0.0.1} PGUSER=${PGUSER:-postgres} PGDATABASE=${PGDATABASE:-test}
run() { printf '%-24s c%-3s ' "$1" "$clients"
        pgbench -n -M prepared -c "$clients" -j "$(( clients < 2 ? 1 : 2 ))" -T "$seconds" -f "$1.sql" 2>/dev/null \
          | sed -n 's/^tps = \([0-9.]*\).*/\1 tps/p'; }
psql -q -f setup.sql
for round in 1 2 3; do run applied_plain; run applied_one_statement; done
psql -q -c "UPDATE idem_pgbench.orders SET status = 'PAID'"
psql -q -c "VACUUM ANALYZE idem_pgbench.orders"
for round in 1 2 3; do run miss_two_statements; run miss_one_statement; done
psql -q -c "DROP SCHEMA idem_pgbench CASCADE"
