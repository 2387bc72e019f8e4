\set id random(1, 100000)
BEGIN;
UPDATE idem_pgbench.orders SET status = 'PAID', version = version + 1 WHERE order_id = :id AND status = 'CREATED' AND version IS NOT NULL;
SELECT status FROM idem_pgbench.orders WHERE order_id = :id;
ROLLBACK;
