"""The panel's header is django-admin-interface's theme title, which defaults to "Django
administration": name the product instead, unless an operator already chose a title.

Cost at fleet size: one row of admin_interface_theme (the panel's themes: a handful).
"""
from django.db import migrations

PANEL_TITLE = "GPU capacity"
DEFAULT_TITLES = ("", "Django administration")


def theme_brand(apps, schema_editor):
    Theme = apps.get_model("admin_interface", "Theme")
    if not Theme.objects.exists():
        # The theme the panel would otherwise create on its first page, with Django's title.
        Theme.objects.create(name=PANEL_TITLE, active=True, title=PANEL_TITLE)
        return
    Theme.objects.filter(title__in=DEFAULT_TITLES).update(title=PANEL_TITLE)


def theme_unbrand(apps, schema_editor):
    Theme = apps.get_model("admin_interface", "Theme")
    Theme.objects.filter(title=PANEL_TITLE).update(title="Django administration")


class Migration(migrations.Migration):

    dependencies = [
        ("capacity", "0005_actor_labels_return_to_service"),
        ("admin_interface", "0032_alter_theme_defaults"),
    ]

    operations = [migrations.RunPython(theme_brand, theme_unbrand)]
