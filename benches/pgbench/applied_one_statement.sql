\set id random(1, 100000)
BEGIN;
WITH upd AS (UPDATE idem_pgbench.orders SET status = 'CREATED', version = version + 1 WHERE order_id = :id AND status = 'CREATED' AND version IS NOT NULL RETURNING version) SELECT CAST(version AS BIGINT) AS applied_version, CAST(1 AS BIGINT) AS found, CAST(NULL AS TEXT) AS current_state, CAST(NULL AS BIGINT) AS current_version, CAST(NULL AS TEXT) AS first_result FROM upd UNION ALL SELECT NULL, CAST(CASE WHEN cur.order_id IS NULL THEN 0 ELSE 1 END AS BIGINT), CAST(cur.status AS TEXT), CAST(cur.version AS BIGINT), res.result FROM (SELECT 1) AS one LEFT JOIN idem_pgbench.orders AS cur ON cur.order_id = :id LEFT JOIN idem_pgbench.idem_results AS res ON res.machine = 'Order' AND res.entity_key = :id::text AND res.from_state = 'CREATED' AND res.to_state = 'CREATED' WHERE NOT EXISTS (SELECT FROM upd);
INSERT INTO idem_pgbench.payments (order_id, amount) VALUES (:id, 100);
COMMIT;
