"""Admin menu: "Savings per cluster", each row linking to the cluster's savings page."""
from __future__ import annotations

from django import forms
from django.conf import settings
from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html

from config.admin_display import ReadOnlyAdminMixin
from config.admin_lookups import ListFiltersCheckedMixin
from config import clock
from savings import services
from savings.models import GpuPrice, SavingsCluster
from savings.views import CLUSTER_CONTENTS_PERMISSION


@admin.register(SavingsCluster)
class SavingsClusterAdmin(ListFiltersCheckedMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("name", "savings_page", "savings_csv")
    list_display_links = None

    def _allowed(self, request) -> bool:
        return request.user.is_active and request.user.has_perm(CLUSTER_CONTENTS_PERMISSION)

    def has_module_permission(self, request):
        return self._allowed(request)

    def has_view_permission(self, request, obj=None):
        return self._allowed(request)

    @admin.display(description="savings")
    def savings_page(self, cluster):
        return format_html('<a href="{}">GPU-hours saved (last 14 days)</a>', reverse("savings:savings",
                                                                                        args=[cluster.name]))

    @admin.display(description="export")
    def savings_csv(self, cluster):
        return format_html('<a href="{}">CSV</a>', reverse("savings:savings_csv", args=[cluster.name]))


class GpuPriceForm(forms.ModelForm):
    """The price is read as text and parsed by the service's rules, so a bad one (empty,
    negative, NaN, inf) is refused in words that say what is wrong, and nothing is saved."""

    price_per_gpu_hour = forms.CharField(
        required=False, label="Price per GPU-hour",
        help_text=GpuPrice._meta.get_field("price_per_gpu_hour").help_text)
    gpu_model = forms.CharField(required=False, label="GPU model",
                                help_text=GpuPrice._meta.get_field("gpu_model").help_text)

    class Meta:
        model = GpuPrice
        fields = ("gpu_model", "price_per_gpu_hour")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.instance.pk:   # a saved price's model is shown read-only: a different model is a new row
            self.fields.pop("gpu_model", None)

    def clean_gpu_model(self):
        try:
            model = services.gpu_model_parse(self.cleaned_data.get("gpu_model"))
        except services.PriceInputError as exc:
            raise forms.ValidationError(str(exc)) from None
        existing = GpuPrice.objects.filter(gpu_model=model).first()
        if existing is not None:
            raise forms.ValidationError(f"GPU model {model} has a price already ({existing.price_per_gpu_hour} per "
                                        f"GPU-hour): change that row instead")
        return model

    def clean_price_per_gpu_hour(self):
        try:
            return services.price_parse(self.cleaned_data.get("price_per_gpu_hour"))
        except services.PriceInputError as exc:
            raise forms.ValidationError(str(exc)) from None


@admin.register(GpuPrice)
class GpuPriceAdmin(ListFiltersCheckedMixin, admin.ModelAdmin):
    """Prices per GPU-hour per GPU model, for the savings page's money; every change audited."""

    form = GpuPriceForm
    list_display = ("gpu_model", "price_per_gpu_hour", "currency", "updated_at")
    readonly_fields = ("updated_at",)

    @admin.display(description="currency")
    def currency(self, obj):
        return settings.SAVINGS_CURRENCY

    def get_readonly_fields(self, request, obj=None):
        # A price belongs to its GPU model: a different model is a new row.
        return ("gpu_model", "updated_at") if obj is not None else ("updated_at",)

    def save_model(self, request, obj, form, change) -> None:
        saved = services.gpu_price_set(gpu_model=obj.gpu_model, price=form.cleaned_data["price_per_gpu_hour"],
                                       actor=request.user, now=clock.now(), currency=settings.SAVINGS_CURRENCY)
        obj.pk, obj.updated_at = saved.pk, saved.updated_at

    def delete_model(self, request, obj) -> None:
        services.gpu_price_delete(price=obj, actor=request.user, now=clock.now(), currency=settings.SAVINGS_CURRENCY)

    def delete_queryset(self, request, queryset) -> None:
        for price in queryset:
            self.delete_model(request, price)
