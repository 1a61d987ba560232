"""The HTTP plumbing every face shares: `http` (answers, status codes, limits), `auth` (the
log-in throttle and API tokens), `middleware` (database-unavailable answers, the content
security policy) and `replicas` (read replicas and their router). Imports models and the base
modules only."""
