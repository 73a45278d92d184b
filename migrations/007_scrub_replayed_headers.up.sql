-- Keys store and replay only the response headers that describe the
-- resource (phase.DefaultReplayHeaders plus what a workflow adds with
-- phase.Workflow.StoreResponses), never cookies or credentials. Releases
-- before that stored every header. This removes from the responses already
-- stored the headers that belong to the caller that got them, so that no
-- process, an older one still running during the deploy included, replays
-- them to another caller. The names are matched without regard to case, as
-- HTTP does. Only rows holding such a header are rewritten.

UPDATE idempotency_keys AS k
SET response_headers = (
    SELECT coalesce(jsonb_object_agg(h.key, h.value), '{}'::jsonb)
    FROM jsonb_each(k.response_headers) AS h
    WHERE lower(h.key) NOT IN ('set-cookie', 'set-cookie2', 'cookie', 'authorization', 'proxy-authorization'))
WHERE CASE WHEN jsonb_typeof(k.response_headers) = 'object' THEN EXISTS (
          SELECT FROM jsonb_object_keys(k.response_headers) AS name
          WHERE lower(name) IN ('set-cookie', 'set-cookie2', 'cookie', 'authorization', 'proxy-authorization'))
      ELSE false END;

COMMENT ON COLUMN idempotency_keys.response_headers IS
    'Stored response headers (name to list of values) that describe the resource, replayed with the status; never cookies, credentials, hop-by-hop headers or Date (see phase.StoreConfig).';
