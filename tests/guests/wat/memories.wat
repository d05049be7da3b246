;; A job component, in text, with a chosen number of linear memories and
;; tables: the trust tests (tests/tests/trust/limits.rs) fill in the
;; placeholders and compile it with the `wat` crate.
;;
;; A core module may define one memory and one table in Wasmtime's pooling
;; allocator, so extra memories and tables come the way a real multi-module
;; component has them: from extra core instances ($memory and $table
;; below), one memory or table each. The main module exports the plugin
;; world's `perform` (record and variant types match `wit/job.wit`
;; structurally), which grows its own memory and every extra memory by the
;; same number of 64 KiB pages, then returns ok: a guest spreading its
;; memory over several memories to stay under a per-memory limit.
;;
;; Placeholders, between @ signs: the extra instances (`(core instance $mN
;; (instantiate $memory))` / `(core instance $tN (instantiate $table))`),
;; the main module's imports of their `grow` functions, the matching `with`
;; clauses, and its body's calls.
(component
  (core module $memory
    (memory (export "memory") 1)
    (func (export "grow") (param i32)
      (drop (memory.grow (local.get 0)))))
  (core module $table
    (table (export "table") 1 funcref))
  @EXTRA_INSTANCES@
  (core module $main
    @IMPORTS@
    (memory (export "memory") 1)
    (global $next (mut i32) (i32.const 1024))
    ;; A bump allocator: the host lowers the job's strings through it.
    (func (export "realloc") (param i32 i32 i32 i32) (result i32)
      (local $at i32)
      (local.set $at
        (i32.and
          (i32.add (global.get $next) (i32.sub (local.get 2) (i32.const 1)))
          (i32.xor (i32.sub (local.get 2) (i32.const 1)) (i32.const -1))))
      (global.set $next (i32.add (local.get $at) (local.get 3)))
      (if (i32.gt_u (global.get $next) (i32.mul (memory.size) (i32.const 65536)))
        (then (drop (memory.grow (i32.const 1)))))
      (local.get $at))
    ;; jid, class, queue, args (pointer + length each), retry-count, enqueued-at-ms.
    (func (export "perform")
      (param i32 i32 i32 i32 i32 i32 i32 i32 i32 i64) (result i32)
      @GROWS@
      ;; The result lives at 0..12: discriminant 0 = ok.
      (i32.store8 (i32.const 0) (i32.const 0))
      (i32.const 0))
  )
  (core instance $i (instantiate $main @WITH@))
  (type $job-record (record
    (field "jid" string)
    (field "class" string)
    (field "queue" string)
    (field "args" string)
    (field "retry-count" u32)
    (field "enqueued-at-ms" u64)))
  ;; Types in an exported function's signature must be exported themselves.
  (export $job "job" (type $job-record))
  (type $job-error-variant (variant
    (case "retry" string)
    (case "discard" string)
    (case "dead" string)))
  (export $job-error "job-error" (type $job-error-variant))
  (func $perform (param "job" $job) (result (result (error $job-error)))
    (canon lift (core func $i "perform")
      (memory (core memory $i "memory"))
      (realloc (core func $i "realloc"))))
  (export "perform" (func $perform))
)
