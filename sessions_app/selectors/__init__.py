"""Every read the pages, the API and the admin make: `core` the session lists, filters,
search, the agents page, attention (what needs a person), previews, usage and budgets and the
deploy gate's view of live sessions. Reads only; imports the store's read helpers, models and
the base modules, never services or a face."""
