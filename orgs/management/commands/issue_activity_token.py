from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from config import clock
from config.actors import CliActorMixin
from orgs.tokens import activity_token_issue


class Command(CliActorMixin, BaseCommand):
    help = "Issue (or rotate) the activity-API token of a caller; the token is printed once."

    def add_arguments(self, parser):
        parser.add_argument("caller", help="who uses the token, e.g. model-gateway")
        parser.add_argument("--user", required=True, help="the account the caller acts as")

    def handle(self, *args, caller, user, **options):
        try:
            account = get_user_model().objects.get(username=user)
        except get_user_model().DoesNotExist:
            raise CommandError(f"no user {user!r}") from None
        try:
            token = activity_token_issue(caller=caller, user=account, actor=None, now=clock.now())
        except ValueError as exc:
            raise CommandError(f"{exc}; no token issued") from None
        self.stdout.write(token)
