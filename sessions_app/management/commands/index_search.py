"""Index new steps for the dashboard's search now (workers do it every few seconds)."""

from django.core.management.base import BaseCommand

from sessions_app.upkeep import search


class Command(BaseCommand):
    help = (
        "Index the steps written since the last pass for the session list's search "
        "(PostgreSQL), until caught up. --rebuild starts over from the first step."
    )

    def add_arguments(self, parser):
        parser.add_argument("--rebuild", action="store_true", help="index every step again")

    def handle(self, *args, **options):
        if not search.enabled():
            self.stdout.write("nothing to index: on this database the search reads the steps")
            return
        if options["rebuild"]:
            search.rebuild()
        total = 0
        while True:
            result = search.index_pending(budget=5.0)
            total += result.steps
            if result.locked_out:
                self.stdout.write("a worker is indexing right now; try again in a moment")
                return
            if not result.behind:
                break
            self.stderr.write(f"\rindexed {total} steps, {result.behind} step ids to go", ending="")
        self.stdout.write(f"indexed {total} steps; the search index is caught up")
