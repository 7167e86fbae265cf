"""`manage.py demo_load ORG/MODEL busy|idle`: simulated traffic on a model (demo only)."""
from django.core.management.base import BaseCommand, CommandError

from clusters.errors import KubeError
from demo.services import DemoInputError, DemoRefused, demo_cluster_require, demo_model_load_set


class Command(BaseCommand):
    help = ("Demo only: make a model busy (requests in flight, 90% GPU utilization) or idle (no requests, "
            "0%) in the simulated cluster: its latest revision's concurrency and what the simulated DCGM "
            "exporter reports for its running pods.")

    def add_arguments(self, parser):
        parser.add_argument("model", help="ORG/MODEL, e.g. acme/llama-3-8b (ORG: the org's slug or its namespace)")
        parser.add_argument("load", choices=["busy", "idle"])

    def handle(self, *args, model, load, **options):
        try:
            sim = demo_cluster_require(command="demo_load")
            result = demo_model_load_set(sim=sim, model=model, busy=load == "busy")
        except (DemoRefused, DemoInputError, KubeError) as exc:
            raise CommandError(str(exc)) from None
        if result.pods:
            pods = (f"its {len(result.pods)} running pod(s) now report {result.utilization}% GPU utilization: "
                    + ", ".join(result.pods))
        else:
            pods = "no pod of it runs now"
            if result.busy:
                pods += ("; the simulated Knative autoscaler sizes the revision for this load "
                         "(within its min/max scale, where GPUs are free)")
        self.stdout.write(f"{result.namespace}/{result.model} is {'busy' if result.busy else 'idle'}: revision "
                          f"{result.revision} has {result.concurrency:g} request(s) in flight "
                          f"(target {result.target:g} per pod); {pods}")
