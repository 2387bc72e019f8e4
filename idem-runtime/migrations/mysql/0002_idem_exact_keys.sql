-- Exact keys: the key columns of the first migration compare under utf8mb4_bin, a PAD SPACE
-- collation, so a key and the same key with trailing spaces ('k' and 'k ') were one inbox
-- record and one stored result, and one entity's first result could be replayed to another.
-- (The first migration's comment says they compare byte for byte: under that collation they
-- do not.) VARBINARY compares every byte, trailing spaces included, on MariaDB and MySQL
-- alike: their NO PAD collations differ (utf8mb4_nopad_bin, utf8mb4_0900_bin), and one
-- migration serves both. Lengths are in bytes now, each holding what the first migration's
-- column could: machine ids (at most 255 bytes, checked at compile time), keys as text (at
-- most 2048 bytes, the 512 characters of utf8mb4, checked before any statement), state
-- names (ASCII, at most 64), inbox groups and keys (at most 255 bytes). The primary key
-- stays under InnoDB's 3072 bytes. Converting rewrites each table once, and a table
-- already converted is left as it is. sqlx decodes these columns as bytes: idem does not
-- read them back, and decodes bytes as UTF-8 where it would.

ALTER TABLE idem_results
    MODIFY machine VARBINARY(255) NOT NULL,
    MODIFY entity_key VARBINARY(2048) NOT NULL,
    MODIFY from_state VARBINARY(64) NOT NULL,
    MODIFY to_state VARBINARY(64) NOT NULL;

ALTER TABLE idem_inbox
    MODIFY consumer_group VARBINARY(255) NOT NULL,
    MODIFY message_key VARBINARY(255) NOT NULL;
