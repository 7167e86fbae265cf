"""`manage.py demo_clock [show | advance DURATION]`: the demo's clocks (demo only)."""
from django.core.management.base import BaseCommand, CommandError

from clusters.errors import KubeError
from demo.services import (DemoInputError, DemoRefused, demo_clock_advance, demo_clocks_read,
                           demo_cluster_require, duration_parse, duration_text, offset_in_words)


class Command(BaseCommand):
    help = ("Demo only: show the clocks, or move the product's clock and the simulated cluster's forward "
            "together (e.g. `advance 25h` to let orgs turn dormant). Time never goes back: restart "
            "`make demo` for wall-clock time.")

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        sub.add_parser("show", help="print both clocks and the offset")
        advance = sub.add_parser("advance", help="move both clocks forward")
        advance.add_argument("duration", help="90s, 30m, 25h, 2d or 1h30m (a unit is required)")

    def handle(self, *args, action, **options):
        try:
            # Parse before touching anything: bad input changes nothing.
            seconds = duration_parse(options["duration"]) if action == "advance" else None
            sim = demo_cluster_require(command="demo_clock")
            if seconds is None:
                clocks = demo_clocks_read(sim=sim)
            else:
                clocks = demo_clock_advance(sim=sim, seconds=seconds)
        except (DemoRefused, DemoInputError, KubeError) as exc:
            raise CommandError(str(exc)) from None
        if seconds is not None:
            self.stdout.write(f"moved the product's clock and the simulated cluster's forward by "
                              f"{duration_text(seconds)} ({seconds:g} seconds)")
        self.stdout.write(f"product now:           {clocks.product_now:%Y-%m-%d %H:%M:%S} UTC "
                          f"({offset_in_words(clocks.offset_seconds)})")
        self.stdout.write(f"simulated cluster now: {clocks.cluster_now:%Y-%m-%d %H:%M:%S} UTC")
