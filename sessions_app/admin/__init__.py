"""The Django admin site: `site` Respawn's AdminSite (its index, log-in and dashboard links),
`registry` the ModelAdmins (registered by sessions_app.apps.RespawnAdminConfig.ready, so this
package imports nothing itself), `forms` the validated forms an edit goes through, `queues` the
RQ queue pages. Every change an admin makes goes through sessions_app.services, as a request
from the dashboard does. May import services, selectors, models and the base modules; nothing
below imports it."""
