"""The JSON API other programs use (django-ninja, mounted at /api/ by config/urls.py): `routes`
the endpoints and their schemas. Writes go through sessions_app.services, reads through
sessions_app.selectors; may import those, upkeep, models and the base modules; nothing below
imports it."""
