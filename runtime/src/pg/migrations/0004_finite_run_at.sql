-- wasmjobs on PostgreSQL, version 4: run_at is a finite time.
--
-- A job due at '-infinity' broke every reader that subtracts times (the
-- latency of `stats`, the dashboard's overview, queues and search: "cannot
-- subtract infinite timestamps"); one due at 'infinity' never runs. Both
-- are refused now: wasmjobs.enqueue says why, and a CHECK covers every
-- other writer (a direct INSERT, a client). Rows already there are mended
-- first: '-infinity' is "as soon as possible", due now; 'infinity' would
-- never run, so the job goes to the dead jobs with the reason.

UPDATE wasmjobs.jobs SET run_at = now() WHERE run_at = '-infinity';

WITH never AS (
    DELETE FROM wasmjobs.jobs WHERE run_at = 'infinity' RETURNING queue, payload
)
INSERT INTO wasmjobs.dead (kind, queue, payload)
SELECT 'dead', queue, payload || jsonb_build_object(
    'error_class', 'wasmjobs::InvalidRunAt',
    'error_message', 'run_at was infinity: the job would never run',
    'failed_at', extract(epoch FROM now()))
FROM never;

ALTER TABLE wasmjobs.jobs ADD CONSTRAINT jobs_run_at_finite CHECK (isfinite(run_at));

-- The enqueue function of version 3, refusing a time that is not finite.
CREATE OR REPLACE FUNCTION wasmjobs.enqueue(
    class      text,
    args       jsonb       DEFAULT '[]',
    queue      text        DEFAULT 'default',
    run_at     timestamptz DEFAULT NULL,
    unique_key text        DEFAULT NULL,
    retry      jsonb       DEFAULT 'true',
    fields     jsonb       DEFAULT '{}'
) RETURNS text
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    jid text := encode(substr(uuid_send(gen_random_uuid()), 1, 12), 'hex');
    now_s double precision := extract(epoch FROM clock_timestamp());
    job jsonb;
BEGIN
    IF class IS NULL OR class = '' THEN
        RAISE EXCEPTION 'wasmjobs.enqueue: class must not be empty';
    END IF;
    IF jsonb_typeof(args) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'wasmjobs.enqueue: args must be a JSON array, not %', coalesce(jsonb_typeof(args), 'NULL');
    END IF;
    IF enqueue.queue IS NULL OR enqueue.queue = '' THEN
        RAISE EXCEPTION 'wasmjobs.enqueue: queue must not be empty';
    END IF;
    IF jsonb_typeof(fields) IS DISTINCT FROM 'object' THEN
        RAISE EXCEPTION 'wasmjobs.enqueue: fields must be a JSON object, not %', coalesce(jsonb_typeof(fields), 'NULL');
    END IF;
    IF enqueue.run_at IS NOT NULL AND NOT isfinite(enqueue.run_at) THEN
        RAISE EXCEPTION 'wasmjobs.enqueue: run_at must be a finite time, not %', enqueue.run_at;
    END IF;
    -- Extra payload fields (tags, your own); the job's own keys win.
    job := fields || jsonb_build_object(
        'class', class, 'args', args, 'queue', enqueue.queue, 'jid', jid,
        'retry', enqueue.retry, 'created_at', now_s, 'enqueued_at', now_s);
    IF enqueue.run_at IS NOT NULL AND enqueue.run_at > now() THEN
        job := job - 'enqueued_at' || jsonb_build_object('at', extract(epoch FROM enqueue.run_at));
    END IF;
    IF enqueue.unique_key IS NULL THEN
        -- No arbiter, no speculative insertion: a plain insert.
        INSERT INTO wasmjobs.jobs (queue, payload, run_at)
        VALUES (enqueue.queue, job, coalesce(enqueue.run_at, now()));
    ELSE
        INSERT INTO wasmjobs.jobs AS j (queue, payload, run_at, unique_key)
        VALUES (enqueue.queue, job, coalesce(enqueue.run_at, now()), enqueue.unique_key)
        ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL DO NOTHING;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
    END IF;
    IF enqueue.run_at IS NULL OR enqueue.run_at <= now() THEN
        PERFORM pg_notify('wasmjobs_jobs', enqueue.queue);
    END IF;
    RETURN jid;
END
$$;
