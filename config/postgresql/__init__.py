"""Django's PostgreSQL backend as the web processes use it (see base)."""
