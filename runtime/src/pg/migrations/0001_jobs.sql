-- wasmjobs on PostgreSQL, version 1: the job table, the dead table, the
-- enqueue function and the wake-up notification.
--
-- A job is one row of `wasmjobs.jobs` from its enqueue until it ends: it
-- is deleted when it succeeds (so the table holds only live work and does
-- not bloat), its row is updated in place for a retry or a reschedule
-- (`run_at`), and it moves to `wasmjobs.dead` when it dies or is
-- cancelled. `owner` and `lease_until` are the claim: a process holds a
-- job while its lease runs, renews every lease it holds a few times per
-- lease, and every completion is fenced on `(owner, claims)`, so a process
-- whose lease was taken over cannot write over the new holder.

CREATE TABLE wasmjobs.jobs (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue       text        NOT NULL,
    -- The job in Sidekiq's format: class, args, jid, retry, ...
    payload     jsonb       NOT NULL CHECK (jsonb_typeof(payload) = 'object'),
    run_at      timestamptz NOT NULL DEFAULT now(),
    -- The process (its identity) holding the job, and until when.
    owner       text,
    lease_until timestamptz,
    -- Times the job was claimed: the fencing token of a completion.
    claims      integer     NOT NULL DEFAULT 0,
    -- Times the job was taken back from a process whose lease ran out.
    recoveries  integer     NOT NULL DEFAULT 0,
    -- At most one live job per key (`wasmjobs.enqueue(unique_key => ...)`).
    unique_key  text,
    CHECK ((owner IS NULL) = (lease_until IS NULL))
);

-- The claim: the due jobs of one queue, oldest first.
CREATE INDEX jobs_claim ON wasmjobs.jobs (queue, run_at, id) WHERE owner IS NULL;
-- The claimed jobs (few: at most the runners' concurrency): the sweep
-- reads the expired ones, a renewal one process's, through this one index.
CREATE INDEX jobs_lease ON wasmjobs.jobs (lease_until) WHERE owner IS NOT NULL;
CREATE UNIQUE INDEX jobs_unique ON wasmjobs.jobs (unique_key) WHERE unique_key IS NOT NULL;

-- Every row is short-lived: vacuum early and without pauses, and leave room
-- on each page for the claim's update.
ALTER TABLE wasmjobs.jobs SET (
    fillfactor = 80,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.01,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0
);

-- Jobs that died (retries exhausted, a poison pill, a payload that cannot
-- run) or were cancelled; trimmed to `--dead-max-jobs` and `--dead-days`.
CREATE TABLE wasmjobs.dead (
    id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind    text        NOT NULL CHECK (kind IN ('dead', 'cancelled')),
    queue   text        NOT NULL,
    payload jsonb       NOT NULL,
    died_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX dead_age ON wasmjobs.dead (kind, died_at);
CREATE INDEX dead_jid ON wasmjobs.dead ((payload ->> 'jid'));

-- Wakes the idle processes: one notification per queue per transaction
-- (PostgreSQL folds identical ones), delivered when the transaction
-- commits, so a rolled-back enqueue wakes nobody. `wasmjobs.enqueue`
-- notifies itself (a row trigger on the insert cost a fifth of its time);
-- this trigger wakes them when a claimed job is handed back due.
CREATE FUNCTION wasmjobs.notify_due() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('wasmjobs_jobs', NEW.queue);
    RETURN NULL;
END
$$;
CREATE TRIGGER jobs_due AFTER UPDATE OF owner ON wasmjobs.jobs
    FOR EACH ROW WHEN (NEW.owner IS NULL AND NEW.run_at <= now())
    EXECUTE FUNCTION wasmjobs.notify_due();

-- Enqueues a job inside the caller's transaction; returns its jid, or NULL
-- when a live job already holds `unique_key`. `fields` adds payload fields
-- (`tags`, your own) beside the ones this function sets.
--   SELECT wasmjobs.enqueue('WelcomeJob', '["x", 1]', queue => 'mail');
CREATE FUNCTION wasmjobs.enqueue(
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
    jid text := substr(replace(gen_random_uuid()::text, '-', ''), 1, 24);
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
    -- Extra payload fields (tags, your own); the job's own keys win.
    job := fields || jsonb_build_object(
        'class', class, 'args', args, 'queue', enqueue.queue, 'jid', jid,
        'retry', enqueue.retry, 'created_at', now_s, 'enqueued_at', now_s);
    IF enqueue.run_at IS NOT NULL AND enqueue.run_at > now() THEN
        job := job - 'enqueued_at' || jsonb_build_object('at', extract(epoch FROM enqueue.run_at));
    END IF;
    INSERT INTO wasmjobs.jobs AS j (queue, payload, run_at, unique_key)
    VALUES (enqueue.queue, job, coalesce(enqueue.run_at, now()), enqueue.unique_key)
    ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL DO NOTHING;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF enqueue.run_at IS NULL OR enqueue.run_at <= now() THEN
        PERFORM pg_notify('wasmjobs_jobs', enqueue.queue);
    END IF;
    RETURN jid;
END
$$;
