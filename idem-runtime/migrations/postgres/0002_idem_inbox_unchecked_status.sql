-- The inbox's status without a CHECK constraint. PostgreSQL prepares a table's CHECK
-- expressions again for every INSERT and UPDATE that writes the table (over a quarter of
-- an inbox delivery's database time, measured, see BENCHMARKS.md), and idem writes only
-- its own four statuses: it reads every record's status and refuses one it does not know
-- (idem::Error::CorruptRecord) instead.
ALTER TABLE idem_inbox DROP CONSTRAINT IF EXISTS idem_inbox_status_check;
