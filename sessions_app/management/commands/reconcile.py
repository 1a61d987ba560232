from django.core.management.base import BaseCommand

from sessions_app.services.dispatch import reconcile


class Command(BaseCommand):
    help = "Dispatch again every runnable session that has no live lease (one pass)."

    def handle(self, *args, **options):
        ids = reconcile()
        self.stdout.write(f"dispatched {len(ids)} session(s)")
        for session_id in ids:
            self.stdout.write(session_id)
