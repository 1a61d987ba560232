"""Respawn's Django app. Its layout, top to bottom (a package imports only what is below it;
make test checks this with the import-linter contracts in pyproject.toml):

- faces: `dashboard` (the HTMX pages), `api` (the JSON API), `admin` (the Django admin),
  `management` (manage.py commands);
- `workers`: the RQ jobs and worker class;
- the integrations: `langgraph`, `openai_agents`;
- `upkeep`: retention, archive, transfer, state upgrade, search indexing;
- `services`: every write made outside a worker's run, and dispatch to the workers;
- `selectors`: every read the faces make;
- `store`: the only code that writes step, checkpoint and graph rows, moves a fencing token
  or claims a lease;
- base modules: `web` (HTTP plumbing), `runtime`, `telemetry`, `validation`, `permissions`,
  `redaction`, `logging`, `sdk_glue`, `checks`;
- `models`: the tables.

Modules moved in this layout keep their old dotted names: queued jobs in Redis, settings and
handlers that name `sessions_app.jobs.run_session_job`, `sessions_app.worker.RespawnWorker`,
`sessions_app.admin_config.RespawnAdminConfig` and the rest still import. An old name is the
same module object as its new one (patching either patches both).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType

# Old module (under sessions_app) -> where it lives now. The old names that are packages now
# (admin, api, services, selectors, langgraph, openai_agents) need no entry: the integrations'
# packages export what their modules did; the others were never named in settings or jobs.
MOVED = {
    "admin_config": "apps",
    "admin_forms": "admin.forms",
    "admin_services": "services.records",
    "admin_site": "admin.site",
    "archive": "upkeep.archive",
    "auth": "web.auth",
    "charts": "dashboard.charts",
    "dispatch": "services.dispatch",
    "graph_models": "models.graph",
    "graph_services": "services.graphs",
    "http": "web.http",
    "jobs": "workers.jobs",
    "middleware": "web.middleware",
    "presenters": "dashboard.presenters",
    "queues_admin": "admin.queues",
    "replicas": "web.replicas",
    "retention": "upkeep.retention",
    "search": "upkeep.search",
    "state_upgrade": "upkeep.state_upgrade",
    "store_portable": "store.portable",
    "store_postgresql": "store.postgresql",
    "trace": "dashboard.trace",
    "transfer": "upkeep.transfer",
    "urls": "dashboard.urls",
    "views": "dashboard.views",
    "worker": "workers.worker",
}


class _MovedLoader(importlib.abc.Loader):
    """Gives the module at the new name for the old one, leaving the module as it was."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.module: ModuleType | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        self.module = importlib.import_module(self.target)
        self.spec = self.module.__spec__
        return self.module

    def exec_module(self, module: ModuleType) -> None:
        # The import system sets the old name's spec on the module; the module keeps its own.
        module.__spec__ = self.spec


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        prefix, _, rest = fullname.partition(".")
        if prefix != __name__ or not rest:
            return None
        head, _, tail = rest.partition(".")
        if head not in MOVED:
            return None
        new = f"{__name__}.{MOVED[head]}" + (f".{tail}" if tail else "")
        return importlib.machinery.ModuleSpec(fullname, _MovedLoader(new))


if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
    sys.meta_path.insert(0, _MovedFinder())
