"""What keeps a deployment's data in shape over time, run by management commands and the
workers' schedules: `retention` (thinning and deleting by policy), `archive` (to object
storage and back), `transfer` (export and import of whole sessions), `state_upgrade`
(rewriting old blobs to the current schema) and `search` (the full-text index of steps).
Imports services, selectors, the store, models and the base modules; the faces may import it,
nothing below does."""
