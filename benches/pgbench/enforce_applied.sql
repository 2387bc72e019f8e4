\set id random(1, 100000)
BEGIN;
UPDATE idem_pgbench.orders SET status = CASE WHEN status = 'CREATED' THEN 'PAID' ELSE 'CREATED' END, version = version + 1 WHERE order_id = :id AND version IS NOT NULL;
INSERT INTO idem_pgbench.payments (order_id, amount) VALUES (:id, 100);
COMMIT;
