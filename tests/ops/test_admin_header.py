"""The panel's header as the operator sees it: a theme naming no environment shows no
environment marker (django-admin-interface drew a dot and " - " before the welcome), and a
theme that names one shows that name."""
from __future__ import annotations

import re

import pytest
from admin_interface.models import Theme

pytestmark = pytest.mark.django_db


def _user_tools(html: str) -> str:
    match = re.search(r'<div id="user-tools">(.*?)</div>', html, re.S)
    assert match, "the admin page has no user tools"
    return match.group(1)


def test_the_header_shows_no_environment_marker_when_the_theme_names_none(admin_client):
    # The active theme as the panel reads it (made as a fresh install makes it when a test
    # before this one in the same database flushed the migration's row).
    assert Theme.objects.get_active().env_name == ""
    tools = _user_tools(admin_client.get("/admin/").content.decode())
    assert "environment-label" not in tools
    assert re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", tools)).strip().startswith("Welcome, admin.")


def test_the_header_names_the_environment_the_theme_names(admin_client):
    theme = Theme.objects.get_active()
    theme.env_name, theme.env_visible_in_header = "staging", True
    theme.save()  # as Admin → Themes saves it (which clears the theme's cache)
    tools = _user_tools(admin_client.get("/admin/").content.decode())
    assert '<span class="environment-label staging">staging</span>' in tools
