"""The RQ side: `jobs` the functions queued in Redis (run a session, run a batch, the
reconciler's sweep), `worker` the worker class (lease-aware shutdown, the heartbeat). The jobs
run the engine's loop with sessions_app.store; they may import everything below the faces.
Queued jobs and settings name `sessions_app.jobs.run_session_job` and
`sessions_app.worker.RespawnWorker` from before this package: sessions_app/__init__.py keeps
those names working."""
