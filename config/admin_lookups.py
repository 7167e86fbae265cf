"""Filters typed into a list's address are answered as Django's admin answers its own invalid
ones: back to the whole list (`?e=1`), which names the filter it could not apply.

Django's admin checks a filter when it builds the query (an unknown field, a value of the
wrong type). Some values only fail when the query is compiled or run: a year outside
1–9999 (`?created_at__year=-1`) is a ValueError, a regular expression PostgreSQL cannot
parse (`?target__regex=((`) a DataError. `ListFiltersCheckedMixin` gives a ModelAdmin a
change list that turns those into the admin's own `IncorrectLookupParameters`."""
from __future__ import annotations

from django.contrib import messages
from django.contrib.admin.options import IS_FACETS_VAR, IS_POPUP_VAR, TO_FIELD_VAR, IncorrectLookupParameters
from django.contrib.admin.views.main import ALL_VAR, ERROR_FLAG, ORDER_VAR, PAGE_VAR, SEARCH_VAR, ChangeList
from django.db import DataError, transaction

# What a list's address carries that is not a filter: page, ordering, search, display switches.
NOT_FILTERS = frozenset({ALL_VAR, ORDER_VAR, PAGE_VAR, SEARCH_VAR, ERROR_FLAG, IS_FACETS_VAR, IS_POPUP_VAR,
                         TO_FIELD_VAR})


class FilterCheckedChangeList(ChangeList):
    def get_results(self, request):
        try:
            # A savepoint: a statement PostgreSQL refused leaves the request's transaction usable.
            with transaction.atomic(using=self.queryset.db):
                super().get_results(request)
        except (ValueError, OverflowError, DataError) as exc:
            raise IncorrectLookupParameters(exc) from exc


class ListFiltersCheckedMixin:
    """A ModelAdmin whose list answers a filter it cannot apply with the whole list and a
    message naming that filter, never a server error."""

    def get_changelist(self, request, **kwargs):
        return FilterCheckedChangeList

    def get_changelist_instance(self, request):
        try:
            return super().get_changelist_instance(request)
        except IncorrectLookupParameters:
            filters = [f"{name}={value}" for name, value in request.GET.items() if name not in NOT_FILTERS]
            # With `e` already set Django shows its own error page; the message would wait for the next one.
            if filters and ERROR_FLAG not in request.GET:
                self.message_user(request, (
                    f"Filter not applied: {filters[0]} is not a field of this list or not a value it can take"
                    if len(filters) == 1 else
                    f"Filters not applied: {', '.join(filters)}: one of them is not a field of this list or not "
                    f"a value it can take") + ". The whole list is shown.", messages.ERROR)
            raise
