"""Run the alert sweep and send the due alert deliveries now (workers do it every second)."""

from django.core.management.base import BaseCommand

from sessions_app.upkeep import alerts


class Command(BaseCommand):
    help = (
        "Raise and resolve alerts from the sessions' states (the sweep), then send every due "
        "delivery once (those whose receiver fails stay queued for their next attempt)."
    )

    def handle(self, *args, **options):
        raised, resolved = alerts.sweep()
        sent: dict[str, int] = {}
        while True:
            outcome = alerts.deliver_due()
            if not outcome:
                break
            for status, count in outcome.items():
                sent[status] = sent.get(status, 0) + count
        summary = ", ".join(f"{n} {status}" for status, n in sorted(sent.items())) or "nothing due"
        self.stdout.write(f"raised {raised}, resolved {resolved}; sent: {summary}")
