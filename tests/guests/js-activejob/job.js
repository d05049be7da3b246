// JsActiveJob: logs `seen<<{json}>>` with the job's class, decoded args,
// ActiveJob context and raw ActiveJob hash, for the host's end-to-end tests.
import { activejob, job, log } from 'wasmjobs-guest';

export const perform = job(async (info, ...args) => {
  const context = activejob.context();
  const raw = activejob.raw();
  const seen = {
    class: info.className,
    args,
    context: context && {
      job_id: context.jobId,
      job_class: context.jobClass,
      executions: context.executions,
      priority: context.priority ?? null,
      locale: context.locale ?? null,
      timezone: context.timezone ?? null,
      enqueued_at: context.enqueuedAt ?? null,
      scheduled_at: context.scheduledAt ?? null,
    },
    raw: raw === null ? null : JSON.parse(raw),
  };
  log.info(`seen<<${JSON.stringify(seen)}>>`);
});
