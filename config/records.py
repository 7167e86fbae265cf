"""Records that cannot be lost.

A run, a decision, a job, a switch, an audit entry: each undoes or accounts for something
the product did, and foreign keys to them (and from them to a cluster or an org) PROTECT.
So a cluster or an org that is gone is not deleted with that history: it is retired (kept,
with when and by whom, left out of `objects`, which every list and periodic job that acts
reads). Only a row nothing names may still be deleted.
"""
from __future__ import annotations

from django.conf import settings
from django.db import models


class InServiceManager(models.Manager):
    """Rows still in service: what the product reads to act (lists, periodic jobs, lookups by
    name). A retired row is kept for the history that names it; `all_objects` reaches it."""

    def get_queryset(self):
        return super().get_queryset().filter(retired_at__isnull=True)


class Retirable(models.Model):
    """A cluster or org that is gone is retired, never deleted with the records of what the
    product did on it: it is kept, with when and by whom, and left out of `objects`."""

    retired_at = models.DateTimeField(null=True, blank=True, db_index=True,
                                      help_text="When it was retired (gone; kept for its history). Empty: in service.")
    retired_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+", help_text="The operator who retired it.")
    retired_by_label = models.CharField(max_length=150, blank=True, default="", db_default="",
                                        help_text="Who retired it when not a panel user: cli:USER@HOST (the OS user and host).")

    # IMPORTANT: `all_objects` first: it is Django's default manager (the admin, forms, related
    # managers), so history pages and the admin still reach retired rows.
    all_objects = models.Manager()
    objects = InServiceManager()

    class Meta:
        abstract = True

    @property
    def retired(self) -> bool:
        return self.retired_at is not None


class RecordsKept(Exception):
    """A delete refused because rows name the row to delete; the message says which and what to do."""


def records_naming(obj: models.Model) -> list[tuple[int, str]]:
    """(count, plural name) of every kind of row whose foreign key names `obj`, those of no
    kind left out: the history a delete of `obj` would have to take away. Hidden reverse
    relations (related_name "+") are counted too: the audit trail names clusters so."""
    found = []
    for field in type(obj)._meta.get_fields(include_hidden=True):
        if not (field.auto_created and not field.concrete and (field.one_to_many or field.one_to_one)):
            continue
        related = field.related_model
        if related._meta.proxy:
            continue
        count = related._base_manager.filter(**{field.field.name: obj}).count()
        if count:
            found.append((count, str(related._meta.verbose_name if count == 1 else related._meta.verbose_name_plural)))
    return sorted(found, key=lambda item: item[1])


def records_kept_message(obj: models.Model, records: list[tuple[int, str]], *,
                         instead: str = "retire it instead") -> str:
    """The one line a refused delete says: what names the row, and what to do instead."""
    what = type(obj)._meta.verbose_name
    listed = [f"{count} {name}" for count, name in records]
    names = listed[0] if len(listed) == 1 else ", ".join(listed[:-1]) + " and " + listed[-1]
    return f"{what} {obj} kept: {names} name it, and deleting it would lose them; {instead}"
