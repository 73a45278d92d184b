-- A completer's claim no longer moves a key's last run: it is no sign of a
-- client that may retry, which the completer's idle threshold waits for.
-- So a key whose claimed run died with its process is due again when its
-- lease runs out. Say so where operators read the table.

COMMENT ON COLUMN idempotency_keys.last_run_at IS
    'When a client''s run last took the lease, or any run gave it back unfinished (a completer''s run cut short by its process stopping leaves it); the completer waits for it to age before picking the key up, and backs off from it. A completer''s claim leaves it as it was, and so does a finish: finished_at says when.';
