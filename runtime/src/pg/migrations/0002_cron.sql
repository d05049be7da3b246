-- wasmjobs on PostgreSQL, version 2: cron ticks claimed in the store.
--
-- A runner on the PostgreSQL store enqueues a schedule's tick only by
-- inserting (schedule, tick) here in the transaction that enqueues the
-- job: the primary key lets exactly one process in, whatever the number of
-- runners, and the job exists if and only if the claim does. Rows older
-- than a day are trimmed by the claims themselves.
CREATE TABLE wasmjobs.cron_ticks (
    schedule    text        NOT NULL,
    tick        bigint      NOT NULL,
    claimed_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (schedule, tick)
);
