"""Admin: the model registry and the serving runbook's operations, each behind its own
permission, with a confirmation page before anything that is not graceful, and an audit record."""
from __future__ import annotations

import re
from urllib.parse import urlencode

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import Max, Prefetch
from django.http import HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join

from capacity.runbook.models import ResourceSpec, RunbookAction, ServedModel
from capacity.runbook import services
from clusters import kube
from clusters.errors import KubeError
from clusters.kube import quantity_parse
from clusters.selectors import clusters_all, node_allocatable_largest
from config import clock
from config.admin_display import JsonAsTablesMixin, ReadOnlyAdminMixin
from config.admin_lookups import ListFiltersCheckedMixin

NOT_GRACEFUL = ("This is NOT graceful: the old revision's pods stop at once, with the requests they are "
                "serving, so the Pending revision can get their GPUs. It is the easiest way to update a "
                "deployment in resource-constrained conditions, not a rollout.")


def _confirm(modeladmin, request, *, title, items, button, action=None, selected=(), warning=None, hidden=None):
    return TemplateResponse(request, "capacity/runbook_confirm.html", {
        **modeladmin.admin_site.each_context(request), "opts": modeladmin.model._meta, "title": title,
        "items": items, "button": button, "action": action, "selected": [str(pk) for pk in selected],
        "hidden": sorted((hidden or {}).items()), "warning": warning,
        "cancel_url": reverse("admin:capacity_servedmodel_changelist")})


# The confirmation page carries the last runbook action recorded when it was shown: a second
# post of the same page (a double click, back and resubmit) finds its own earlier action newer
# than that, and is not carried out again.
SHOWN_AFTER = "actions_up_to"


def _actions_up_to() -> int:
    return RunbookAction.objects.aggregate(last=Max("pk"))["last"] or 0


def _done_since(request, model: ServedModel, *, action: str) -> RunbookAction | None:
    """The `action` on `model` recorded since the confirmation posted in `request` was shown,
    done or under way (a failed one may be confirmed again); None without such a page."""
    raw = request.POST.get(SHOWN_AFTER, "")
    if not raw.isdigit():
        return None
    return RunbookAction.objects.filter(served_model=model, action=action, pk__gt=int(raw)) \
        .exclude(state=RunbookAction.State.FAILED).select_related("actor").order_by("pk").first()


# A new revision starts its initial scale (1 pod unless the owner set it) whatever the model's
# min-scale: a model its owner let scale to zero holds GPUs again until the autoscaler ends them.
ASLEEP_WAKES = (". It holds no GPU now (scaled to zero at the last registry sync): its new revision starts its "
                "initial scale (1 pod unless its owner set it) and holds GPUs until the autoscaler scales it back "
                "to zero")
ASLEEP_WARNING = "Some of these models are scaled to zero: redeploying starts pods for them for a while."
# A model its dormant org keeps at zero: what its new revision does is said model by model.
DORMANT_WAKES = ("Some of these models are kept at zero by their dormant org and redeploying starts pods for them "
                 "until they are back at zero: see each.")


def scaled_to_zero(model: ServedModel) -> bool:
    """At the last registry sync no revision of it had a pod, running or pending (a CPU-only
    pynode holds no GPU while it runs: GPUs held do not tell)."""
    return bool(model.revisions) and not any(r.get("pods_running") or r.get("pods_pending") for r in model.revisions)


def redeploy_item(model: ServedModel, plan, error: str) -> str:
    """One model on the redeploy's confirmation, as read from the cluster just now."""
    head = f"{model} on {model.cluster} ({model.kind}): "
    if error:
        return head + (f"it could not be read now ({error}); the redeploy reads it again before its write and "
                       "says then what its new revision does")
    if plan.asleep:
        return head + f"{plan.asleep}. Redeployed, {plan.effect}"
    return head + "a new revision rolls out, then the old one is retired" + (ASLEEP_WAKES if scaled_to_zero(model)
                                                                             else "")


def redeploy_done(model: ServedModel, plan) -> tuple[str, int]:
    """What the redeploy did, and the message level: a model its org keeps at zero says
    whether it stayed asleep or what woke it."""
    if not plan.asleep:
        return f"{model}: redeploy started (a new revision rolls out)", messages.SUCCESS
    if plan.wakes:
        return f"{model}: redeploy started, and it wakes for a while: {plan.asleep}; {plan.effect}", messages.WARNING
    return f"{model}: redeployed asleep: {plan.asleep}; {plan.effect}", messages.SUCCESS

ACTION_NAMES = {"model_redeploy": "redeploy", "revision_delete_old": "delete the old revision",
                "model_delete_stuck": "delete stuck model", "resource_spec_apply": "resource spec"}


def _when(moment) -> str:
    return f"{moment:%Y-%m-%d %H:%M:%S} UTC" if moment else "-"


def action_state(row: RunbookAction) -> str:
    """What the panel says of a runbook action: only what is known."""
    if row.state == RunbookAction.State.ACTING:
        if row.acting_expires_at and row.acting_expires_at < clock.now():
            return (f"acting since {_when(row.at)}: its process stopped before recording the outcome; the next "
                    "registry sync settles it from the cluster")
        return f"acting since {_when(row.at)}: the cluster write may be under way"
    if row.state == RunbookAction.State.FAILED:
        return f"failed at {_when(row.settled_at)}: {row.error}"
    return f"done at {_when(row.settled_at)}" + (f" ({row.error})" if row.error else "")


@admin.register(ServedModel)
class ServedModelAdmin(ListFiltersCheckedMixin, JsonAsTablesMixin, admin.ModelAdmin):
    # Five columns that fit a 1366 px laptop beside the filters: what it is, whose, its
    # state, its revisions, and what an operator can do or has under way on it.
    list_display = ("served_model", "org_slug_column", "status", "revision_summary", "actions_column")
    list_display_links = None     # the first column carries its own link
    list_filter = ("cluster", "kind", "ready", "gone", "framework")
    search_fields = ("name", "namespace", "model", "org_slug")
    readonly_fields = [f.name for f in ServedModel._meta.fields]
    actions = ["sync_registry", "redeploy", "delete_stuck"]
    change_list_template = "capacity/servedmodel_change_list.html"

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("cluster").prefetch_related(
            Prefetch("runbook_actions", queryset=RunbookAction.objects.order_by("-at", "-id"), to_attr="actions_seen"))

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False   # deleting the row would not delete the model: use "delete a model stuck deploying"

    def has_sync_servedmodel_permission(self, request):
        return request.user.has_perm("capacity.sync_servedmodel")

    def has_redeploy_servedmodel_permission(self, request):
        return request.user.has_perm("capacity.redeploy_servedmodel")

    def has_delete_stuck_model_permission(self, request):
        return request.user.has_perm("capacity.delete_stuck_model")

    @admin.display(description="served model (kind, model, framework, cluster)", ordering="name")
    def served_model(self, obj):
        return format_html('<a href="{}">{}</a><div class="runbook-sub">{} · model {} · {} · {}</div>',
                           reverse("admin:capacity_servedmodel_change", args=[obj.pk]), obj, obj.get_kind_display(),
                           obj.model, obj.framework or "-", obj.cluster)

    @admin.display(description="org", ordering="org_slug")
    def org_slug_column(self, obj):
        return obj.org_slug or "-"

    @admin.display(description="status (GPUs held, last sync)", ordering="ready")
    def status(self, obj):
        state = "gone from the cluster" if obj.gone else ("Ready" if obj.ready else "not Ready")
        return format_html("{}<div class=\"runbook-sub\">{} GPU(s) held · synced {}</div>", state, obj.gpus_held,
                           _when(obj.synced_at))

    @admin.display(description="revisions (ready / running / pending)")
    def revision_summary(self, obj):
        if not obj.revisions:
            return "-"
        return format_html_join("", '<div class="runbook-rev">{}: {}, {} running, {} pending</div>', (
            (r["name"], "ready" if r["ready"] else "not ready", r["pods_running"], r["pods_pending"])
            for r in obj.revisions))

    def get_list_display(self, request):
        # The unblock link only for those who may follow it; the others read what blocks.
        if request.user.has_perm("capacity.delete_old_revision"):
            return self.list_display
        return tuple("actions_column_seen" if c == "actions_column" else c for c in self.list_display)

    @admin.display(description="unblock a Pending revision; runbook actions under way or failed")
    def actions_column(self, obj, *, may_unblock: bool = True):
        parts = [format_html('<div><a href="{}">delete the old revision {} ({} GPU)</a></div>',
                             reverse("admin:capacity_servedmodel_unblock", args=[obj.pk, b["old_revision"]]),
                             b["old_revision"], b["gpus_held"]) if may_unblock else
                 format_html("<div>the old revision {} ({} GPU) blocks a Pending one: deleting it needs the "
                             "'delete old revision' permission</div>", b["old_revision"], b["gpus_held"])
                 for b in obj.blocked]
        latest: dict[str, RunbookAction] = {}
        for row in getattr(obj, "actions_seen", ()):
            latest.setdefault(row.action, row)
        for row in latest.values():
            if row.state != RunbookAction.State.DONE:
                parts.append(format_html('<div class="runbook-{}"><a href="{}">{}</a> {}</div>', row.state,
                                         reverse("admin:capacity_runbookaction_change", args=[row.pk]),
                                         ACTION_NAMES.get(row.action, row.action), action_state(row)))
        return format_html_join("", "{}", ((p,) for p in parts)) if parts else "-"

    @admin.display(description="Pending revisions blocked; runbook actions under way or failed")
    def actions_column_seen(self, obj):
        return self.actions_column(obj, may_unblock=False)

    def get_urls(self):
        return [path("<int:pk>/unblock/<str:revision>/", self.admin_site.admin_view(self.unblock_view),
                     name="capacity_servedmodel_unblock")] + super().get_urls()

    # --- actions ---------------------------------------------------------------------------------
    @admin.action(description="Sync the registry from these models' clusters", permissions=["sync_servedmodel"])
    def sync_registry(self, request, queryset):
        for cluster in {m.cluster for m in queryset}:
            try:
                rows = services.registry_sync(cluster=cluster)
            except KubeError as exc:
                self.message_user(request, f"{cluster}: {exc}", messages.ERROR)
                continue
            self.message_user(request, f"{cluster}: {len(rows)} model(s) synced")

    @admin.action(description="Redeploy (new revision, no other change)", permissions=["redeploy_servedmodel"])
    def redeploy(self, request, queryset):
        models = [m for m in queryset if not m.gone]
        reads = services.RedeployReads()     # each cluster's config-autoscaler once, not once per model
        if request.POST.get("confirm") != "yes":
            previews = services.redeploy_preview(models=models, reads=reads)
            warnings = [ASLEEP_WARNING if any(scaled_to_zero(m) and not (plan and plan.asleep)
                                              for m, plan, _ in previews) else "",
                        DORMANT_WAKES if any(plan and plan.wakes for _, plan, _ in previews) else ""]
            return _confirm(self, request, title="Redeploy these models?", button="Redeploy",
                            items=[redeploy_item(m, plan, error) for m, plan, error in previews],
                            action="redeploy", selected=[m.pk for m in models], hidden={SHOWN_AFTER: _actions_up_to()},
                            warning=" ".join(w for w in warnings if w) or None)
        for model in models:
            earlier = _done_since(request, model, action="model_redeploy")
            if earlier is not None:
                self.message_user(request, f"{model}: not redeployed again: a redeploy was asked since this "
                                           f"confirmation was shown (at {_when(earlier.at)} by "
                                           f"{earlier.actor or 'system'}, {action_state(earlier)}); select the model "
                                           f"again to redeploy once more", messages.WARNING)
                continue
            try:
                plan = services.model_redeploy(model=model, actor=request.user, reads=reads)
            except services.RunbookUnsettled as exc:
                self.message_user(request, str(exc), messages.WARNING)
                continue
            except KubeError as exc:
                self.message_user(request, f"{model}: redeploy not done: {exc}", messages.ERROR)
                continue
            self.message_user(request, *redeploy_done(model, plan))

    @admin.action(description="Delete a model stuck deploying (and what it left behind)",
                  permissions=["delete_stuck_model"])
    def delete_stuck(self, request, queryset):
        stuck = [m for m in queryset if not m.gone and not m.ready and m.kind == ServedModel.Kind.INFERENCE_SERVICE]
        refused = [m for m in queryset if m not in stuck]
        for model in refused:
            self.message_user(request, f"{model}: not an InferenceService stuck deploying; left alone",
                              messages.WARNING)
        if not stuck:
            return None
        if request.POST.get("confirm") != "yes":
            return _confirm(self, request, title="Delete these models stuck deploying?", button="Delete",
                            items=[f"{m} on {m.cluster}: InferenceService, its Knative Service, Configuration "
                                   f"and Revisions" for m in stuck], action="delete_stuck", selected=[m.pk for m in stuck],
                            warning=f"You ({request.user}) will be recorded as the operator who deleted them.")
        for model in stuck:
            try:
                deleted = services.model_delete_stuck(model=model, actor=request.user)
            except services.RunbookUnsettled as exc:
                self.message_user(request, str(exc), messages.WARNING)
                continue
            except (KubeError, services.RunbookRefused) as exc:
                self.message_user(request, f"{model}: {exc}", messages.ERROR)
                continue
            self.message_user(request, f"{model}: deleted {', '.join(deleted) or 'nothing left'}")

    # --- unblock a Pending deployment ----------------------------------------------------------------
    def unblock_view(self, request, pk: int, revision: str):
        if not request.user.has_perm("capacity.delete_old_revision"):
            raise PermissionDenied("deleting an old revision needs the 'delete old revision' permission")
        model = get_object_or_404(ServedModel, pk=pk)
        blocked = next((b for b in model.blocked if b["old_revision"] == revision), None)
        changelist = reverse("admin:capacity_servedmodel_changelist")
        if blocked is None:
            self.message_user(request, f"{revision} is not blocking a Pending revision of {model}", messages.ERROR)
            return HttpResponseRedirect(changelist)
        if request.method == "POST" and request.POST.get("confirm") == "yes":
            try:
                done = services.revision_delete_old(model=model, revision=revision, actor=request.user)
            except services.RunbookUnsettled as exc:
                self.message_user(request, str(exc), messages.WARNING)
            except (KubeError, services.RunbookRefused) as exc:
                self.message_user(request, f"{model}: {exc}", messages.ERROR)
            else:
                self.message_user(request, f"deleted {revision}: {done.pending_revision} can now get its GPUs")
                try:
                    services.registry_sync(cluster=model.cluster)
                except KubeError as exc:
                    self.message_user(request, f"the registry could not be synced after it ({exc}); the list shows "
                                               f"the last sync", messages.WARNING)
            return HttpResponseRedirect(changelist)
        return _confirm(self, request, title=f"Delete the old revision {revision} of {model} on {model.cluster}?",
                        items=[f"{blocked['reason']} (as the registry sync at {_when(model.synced_at)} saw it; the "
                               f"cluster is read again before anything is deleted)"],
                        button=f"Delete {revision}", warning=NOT_GRACEFUL)


# A Kubernetes quantity as the runbook's specs use them: a positive number, an optional
# decimal or binary suffix ("500m", "4", "32Gi", "1.5"); NaN, infinities, signs and
# exponents are refused.
QUANTITY = re.compile(r"^(?:\d+(?:\.\d+)?|\.\d+)(?:m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
# More GPUs per pod than any GPU node holds would leave its pods Pending for good.
MAX_GPUS_PER_POD = 16


class ResourceSpecForm(forms.ModelForm):
    class Meta:
        model = ResourceSpec
        fields = ("cluster", "model", "gpu_count", "gpu_product", "cpu_request", "cpu_limit", "memory_request",
                  "memory_limit")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if "cluster" in self.fields:
            self.fields["cluster"].queryset = clusters_all()   # in service: none that is retired

    def clean_gpu_count(self):
        count = self.cleaned_data.get("gpu_count")
        if count is not None and count > MAX_GPUS_PER_POD:
            raise forms.ValidationError(f"at most {MAX_GPUS_PER_POD} GPUs per pod, got {count}")
        return count

    def clean(self):
        data = super().clean()
        for name in ("cpu_request", "cpu_limit", "memory_request", "memory_limit"):
            value = (data.get(name) or "").strip()
            data[name] = value
            if value and (not QUANTITY.match(value) or not any(c in "123456789" for c in value)):
                self.add_error(name, f"{value!r} is not a positive Kubernetes quantity (e.g. 4, 500m, 32Gi)")
        if not self.errors:
            self._check_amounts(data)
        if data.get("cluster") and data.get("model") and not self.errors:
            try:
                services.resource_spec_targets(ResourceSpec(cluster=data["cluster"], model=data["model"]))
            except services.RunbookRefused as exc:
                self.add_error("model", str(exc))
        return data


    def _check_amounts(self, data: dict) -> None:
        """A request above its limit is refused by the API server, and more than the largest
        node gives leaves every new pod Pending: both are refused here, naming the field."""
        amounts = {name: quantity_parse(data[name]) for name in ("cpu_request", "cpu_limit", "memory_request",
                                                                  "memory_limit") if data.get(name)}
        for kind in ("cpu", "memory"):
            request, limit = amounts.get(f"{kind}_request"), amounts.get(f"{kind}_limit")
            if request is not None and limit is not None and request > limit:
                self.add_error(f"{kind}_request", f"the {kind} request {data[f'{kind}_request']} is more than its "
                                                  f"limit {data[f'{kind}_limit']}")
        if not amounts or not data.get("cluster") or self.errors:
            return
        try:
            largest = node_allocatable_largest(kube.gateway_for(data["cluster"]))
        except KubeError:
            return   # the cluster cannot say now; the preview reads it again before anything is sent
        for name, amount in amounts.items():
            kind = name.split("_")[0]
            if kind in largest and amount > largest[kind][0]:
                self.add_error(name, f"{data[name]} is more {kind} than any node of {data['cluster']} can give a "
                                     f"pod (the largest allocatable is {largest[kind][1]})")


def _amount(value: str | None) -> str:
    return "not set" if value is None else value


@admin.register(ResourceSpec)
class ResourceSpecAdmin(ListFiltersCheckedMixin, admin.ModelAdmin):
    """Adding a spec redeploys every deployed version of the model with it, in whatever org
    each runs: the form first shows what would change, by org, and nothing is saved or sent
    until that page is confirmed."""

    form = ResourceSpecForm
    list_display = ("model", "cluster", "gpu_count", "gpu_product", "cpu_request", "cpu_limit", "memory_request",
                    "memory_limit", "created_by", "created_at", "applied_summary")
    list_filter = ("cluster",)
    search_fields = ("model",)
    fields = ("cluster", "model", "gpu_count", "gpu_product", "cpu_request", "cpu_limit", "memory_request",
              "memory_limit")

    def has_change_permission(self, request, obj=None):
        return obj is None and super().has_change_permission(request, obj)  # a new spec, never an edit

    def has_delete_permission(self, request, obj=None):
        return False   # the record of what was deployed stays

    @admin.display(description="applied to")
    def applied_summary(self, obj):
        return "; ".join(a["target"] + (f" (failed: {a['error']})" if "error" in a else "")
                         + (" (already had them: unchanged)" if a.get("unchanged") else "") for a in obj.applied)

    def add_view(self, request, form_url="", extra_context=None):
        if request.method == "POST" and request.POST.get("confirm") != "yes":
            if not self.has_add_permission(request):
                raise PermissionDenied
            form = self.get_form(request, None, change=False)(request.POST)
            if form.is_valid():
                return self._preview(request, form, services.resource_spec_preview(spec=form.save(commit=False)))
        # A GET, a confirmed preview (validated again, then saved and applied), or a form with errors.
        return super().add_view(request, form_url, extra_context)

    def _preview(self, request, form, changes) -> TemplateResponse:
        """The confirmation page: each org, each of its versions of the model, each request
        and limit old → new, as read from the cluster just now. The spec's fields ride along
        hidden, so confirming posts the very values previewed."""
        spec = form.cleaned_data
        by_org: dict[str, list] = {}
        for change in changes:
            by_org.setdefault(change.org or "(no org)", []).append(change)
        redeploys = [c for c in changes if c.redeploys]
        back = reverse("admin:capacity_resourcespec_add") + "?" + urlencode(
            {f.name: f.value() for f in form if f.value() not in (None, "")})
        return TemplateResponse(request, "capacity/resourcespec_preview.html", {
            **self.admin_site.each_context(request), "opts": self.model._meta,
            "title": f"Resources of {spec['model']} on {spec['cluster']}: what changes",
            "form": form, "orgs": [
                {"org": org, "models": [{
                    "change": c, "amounts": [dict(resource=a.resource, changed=a.changed,
                                                  request=f"{_amount(a.request_old)} → {_amount(a.request_new)}",
                                                  limit=f"{_amount(a.limit_old)} → {_amount(a.limit_new)}")
                                             for a in c.amounts],
                    "gpu_product": f"{_amount(c.gpu_product_old)} → {_amount(c.gpu_product_new)}",
                } for c in models]}
                for org, models in sorted(by_org.items())],
            "redeploy_count": len(redeploys), "org_count": len({c.org for c in redeploys}),
            "model_count": len(changes), "back_url": back})

    def save_model(self, request, obj, form, change):
        obj.created_at = clock.now()
        obj.created_by = request.user
        super().save_model(request, obj, form, change)
        # IMPORTANT: after the admin's transaction commits. Each patch is announced in its own
        # committed row before it is sent; inside this transaction it would not be.
        transaction.on_commit(lambda: self._apply(request, obj))

    def _apply(self, request, obj):
        try:
            applied = services.resource_spec_apply(spec=obj, actor=request.user)
        except services.RunbookRefused as exc:
            self.message_user(request, str(exc), messages.WARNING)
            return
        failed = [a for a in applied if "error" in a]
        unchanged = [a for a in applied if a.get("unchanged")]
        self.message_user(request, f"redeploying {len(applied) - len(failed) - len(unchanged)} version(s) of "
                                   f"{obj.model}" + (f"; {len(unchanged)} already had these resources (left as they "
                                                     f"are)" if unchanged else "")
                                   + (f"; {len(failed)} failed" if failed else ""),
                          messages.WARNING if failed else messages.SUCCESS)


@admin.register(RunbookAction)
class RunbookActionAdmin(ListFiltersCheckedMixin, ReadOnlyAdminMixin, JsonAsTablesMixin, admin.ModelAdmin):
    list_display = ("at", "actor", "action", "target", "cluster", "outcome")
    list_display_links = ("at",)
    list_filter = ("state", "action", "cluster")
    search_fields = ("target",)
    readonly_fields = [f.name for f in RunbookAction._meta.fields] + ["outcome"]

    @admin.display(description="state and outcome", ordering="state")
    def outcome(self, obj):
        return format_html('<span class="runbook-{}">{}</span>', obj.state, action_state(obj))
