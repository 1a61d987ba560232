"""The HTMX web dashboard operators and support staff use: `views` the pages and actions,
`urls` their routes, `presenters` how rows read on a page, `trace` the trace view, `charts`
the usage charts. Writes go through sessions_app.services, reads through
sessions_app.selectors; may import those, upkeep, models and the base modules; nothing below
imports it."""
