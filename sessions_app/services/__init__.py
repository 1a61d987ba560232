"""Every write a person or a program makes outside a worker's run: `core` the operator
actions (start, resume, cancel, roll back, fork, approve, correct, edit) and the status policy
they share, `records` the admin site's edits, `graphs` LangGraph threads' operator actions,
`dispatch` how a session's run reaches the workers (enqueue, dedupe, the reconciler's
queue), `workqueue` who owns a session (take, hand on, put back) and people's notes on
it. Each action checks the status policy, writes through sessions_app.store, audits
itself and enqueues the run. Used by the dashboard, the API, the admin, the workers and
upkeep; imports selectors, the store, models and the base modules, never a face."""
