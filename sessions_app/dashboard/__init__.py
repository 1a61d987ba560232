"""The HTMX web dashboard operators and support staff use: `views` the pages and the one
view that takes every action, `actions` the table of operator actions (what each reads,
who may take it, its status rule, its service), `page` the session page's context (built
once for the page and every part it redraws), `urls` their routes (the action URLs from the
table), `presenters` how rows read on a page, `trace` the trace view, `charts` the usage
charts. Writes go through sessions_app.services, reads through
sessions_app.selectors; may import those, upkeep, models and the base modules; nothing below
imports it."""
