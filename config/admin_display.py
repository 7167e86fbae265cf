"""Read-only display of JSON values in the panel as tables instead of raw JSON.

`json_table(value)` renders a mapping as a two-column table, a list of mappings as a table
with one column per key, a list of plain values as a list, nested values recursively.
`JsonAsTablesMixin` makes a ModelAdmin show each of its read-only JSON fields that way
(the field keeps its label and help text; it is never editable through it).
`actor_display` shows who acted; `ReadOnlyAdminMixin` keeps service-written rows read only."""
from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import JSONField
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from config.actors import actor_describe

EMPTY = "—"
MAX_ROWS = 200   # rows shown of a long list; the rest is counted, not rendered


def _cell(value: Any) -> SafeString | str:
    if isinstance(value, (dict, list, tuple)):
        return json_table(value)
    if value is None or value == "":
        return EMPTY
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def json_table(value: Any) -> SafeString | str:
    if isinstance(value, dict):
        if not value:
            return EMPTY
        rows = format_html_join("", '<tr><th scope="row">{}</th><td>{}</td></tr>',
                                ((key, _cell(item)) for key, item in value.items()))
        return format_html('<table class="json-table json-mapping"><tbody>{}</tbody></table>', rows)
    if isinstance(value, (list, tuple)):
        if not value:
            return EMPTY
        shown, rest = list(value[:MAX_ROWS]), len(value) - MAX_ROWS
        more = format_html('<p class="json-more">… and {} more</p>', rest) if rest > 0 else ""
        if all(isinstance(item, dict) for item in shown):
            columns: list[str] = []
            for item in shown:
                columns += [key for key in item if key not in columns]
            head = format_html_join("", '<th scope="col">{}</th>', ((c,) for c in columns))
            body = format_html_join("", "<tr>{}</tr>", (
                (format_html_join("", "<td>{}</td>", ((_cell(item.get(c)),) for c in columns)),) for item in shown))
            return format_html('<table class="json-table json-rows"><thead><tr>{}</tr></thead><tbody>{}</tbody>'
                               "</table>{}", head, body, more)
        items = format_html_join("", "<li>{}</li>", ((_cell(item),) for item in shown))
        return format_html('<ul class="json-list">{}</ul>{}', items, more)
    return _cell(value)


class JsonAsTablesMixin:
    """Read-only JSON fields of the model are shown through `json_table` (`<name>_table`)."""

    def _json_field_names(self) -> set[str]:
        return {f.name for f in self.model._meta.get_fields() if isinstance(f, JSONField)}

    def get_readonly_fields(self, request, obj=None):
        names = self._json_field_names()
        return [f"{n}_table" if isinstance(n, str) and n in names else n
                for n in super().get_readonly_fields(request, obj)]

    def get_exclude(self, request, obj=None):
        names = self._json_field_names()
        shown = [n for n in super().get_readonly_fields(request, obj) if isinstance(n, str) and n in names]
        return [*(super().get_exclude(request, obj) or ()), *shown]

    def get_fields(self, request, obj=None):
        if self.fields:
            names = self._json_field_names()
            return [f"{n}_table" if isinstance(n, str) and n in names else n for n in self.fields]
        return super().get_fields(request, obj)

    def __getattr__(self, name: str):
        # Only "<json field>_table"; `model` itself is never looked up here (a ModelAdmin
        # sets it on the instance, an inline on its class), so this cannot recurse.
        if name.endswith("_table") and name != "model" and getattr(self, "model", None) is not None:
            field_name = name[: -len("_table")]
            if field_name in self._json_field_names():
                field = self.model._meta.get_field(field_name)

                @admin.display(description=field.verbose_name)
                def show(obj, _name=field_name):
                    return json_table(getattr(obj, _name))

                return show
        raise AttributeError(name)


def json_table_display(field_name: str, description: str = ""):
    """An admin display method for one JSON field (for inlines and explicit field lists)."""

    @admin.display(description=description or field_name.replace("_", " "))
    def show(self, obj):
        return json_table(getattr(obj, field_name))

    return show



def actor_display(user_field: str, label_field: str, description: str = "by", ordering: str | None = None):
    """An admin display method naming who acted: the user of `user_field` (or the label kept in
    `label_field` once that user is gone), or the schedule."""

    @admin.display(description=description, ordering=ordering)
    def show(self, obj) -> str:
        return actor_describe(getattr(obj, user_field), getattr(obj, label_field))

    return show


class ReadOnlyAdminMixin:
    """Rows written only by services: the panel shows them and never adds, changes or deletes one.
    (`obj` is optional so the same methods serve a ModelAdmin and an inline.)"""

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
