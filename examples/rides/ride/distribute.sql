-- Distributes the rides tables on a Citus coordinator, after schema.sql and
-- atomicphase.Distribute, in one transaction, one statement at a time (a
-- foreign key's statement is passed on to the workers as it is written,
-- and they refuse several commands in one text).
--
-- users is a reference table, a copy on every node: phases only read it,
-- and each node reads its own copy. rides, audit_records and receipts are
-- distributed by tenant, co-located with idempotency_keys. River's tables
-- stay on the coordinator.
--
-- Citus distributes a table only once the tables its foreign keys refer to
-- are distributed, and will not distribute a table it has tied to a
-- reference table by a foreign key, so the keys to users are dropped first
-- and added back at the end. The keys to a reference table must then be
-- checked over one connection per node, hence the sequential mode.
SET LOCAL citus.multi_shard_modify_mode TO sequential;
ALTER TABLE rides DROP CONSTRAINT rides_user_fkey;
ALTER TABLE audit_records DROP CONSTRAINT audit_records_user_fkey;
SELECT create_reference_table('users');
SELECT create_distributed_table('rides', 'tenant', colocate_with => 'idempotency_keys');
SELECT create_distributed_table('audit_records', 'tenant', colocate_with => 'idempotency_keys');
SELECT create_distributed_table('receipts', 'tenant', colocate_with => 'idempotency_keys');
ALTER TABLE rides ADD CONSTRAINT rides_user_fkey FOREIGN KEY (user_id) REFERENCES users (id);
ALTER TABLE audit_records ADD CONSTRAINT audit_records_user_fkey FOREIGN KEY (user_id) REFERENCES users (id);
