"""Who acts when there is no logged-in user: a management command or an API token.

Audit rows keep a user foreign key for operators of the panel; a command run from a shell
or a call with the activity API's bearer token has no such user, so it is named by a label
instead ("cli:<os user>@<host>", "token:<caller>"). The label is carried in a context
variable for the length of the command or request (as django-auditlog's `set_actor`
does), so every audit row written meanwhile, by whichever service, records it without
each service growing a parameter. Rows written by a worker or the beat carry none.
"""
from __future__ import annotations

import contextvars
import getpass
import socket
from collections.abc import Iterator
from contextlib import contextmanager

_label: contextvars.ContextVar[str] = contextvars.ContextVar("gpu_capacity_actor_label", default="")

LABEL_MAX = 150  # characters kept of a label (the audit columns' width)


def actor_label_current() -> str:
    """The label of whoever acts in this context, or "" (the panel's user, a worker, the beat).

    The `default` of every `actor_label` field: a row gets the label when it is created."""
    return _label.get()


@contextmanager
def acting_as(label: str) -> Iterator[str]:
    token = _label.set(label[:LABEL_MAX])
    try:
        yield label[:LABEL_MAX]
    finally:
        _label.reset(token)


def cli_label() -> str:
    """`cli:<os user>@<host>`: the shell account a command ran under, and where."""
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - no login name in a bare container: say so rather than fail
        user = "unknown"
    return f"cli:{user}@{socket.gethostname()}"


def token_label(caller: str) -> str:
    return f"token:{caller}"


def actor_describe(user, label: str) -> str:
    """How the panel names an actor: the user, the label, both ("ops via cli:…"), or "—"."""
    if user is not None and label:
        return f"{user.get_username()} via {label}"
    if user is not None:
        return user.get_username()
    return label or "—"


class CliActorMixin:
    """For management commands: everything the command writes is audited as run from this
    shell (`cli:<os user>@<host>`), whichever service writes it."""

    def execute(self, *args, **options):
        with acting_as(cli_label()):
            return super().execute(*args, **options)
