"""Runbook operations (seed 002) in the admin, on the simulated cluster through the real
client: registry sync, resource specs, redeploy, unblocking a Pending revision by
deleting the old one, deleting a model stuck deploying. Each needs its own permission
and leaves an audit record naming the operator."""
from __future__ import annotations

import re

import kubernetes
import pytest
from django.contrib.auth.models import Permission, User

from audit.models import AuditEntry
from capacity.runbook.models import ResourceSpec, RunbookAction, ServedModel
from capacity.runbook import services
from orgs.models import Org
from simcluster.generate import inference_service, namespace, node, pynode

pytestmark = pytest.mark.django_db
NS = "org-acme"
A10G = "NVIDIA-A10G"


def scenario() -> list[dict]:
    """One GPU in all: two revisions of a 1-GPU model cannot both run (seed 002)."""
    return [node("gpu-a10g-00", pool="a10g", product=A10G, gpus=1, cpu="32", memory="127532Mi"),
            node("cpu-00", pool="cpu", cpu="64", memory="257000Mi"),
            namespace(NS, org="acme"),
            inference_service(NS, "zq86d3o", product=A10G, gpus=1, min_replicas=1, max_replicas=1),
            pynode(NS)]


@pytest.fixture
def world(sim_cluster_factory):
    handle = sim_cluster_factory(scenario())
    handle.advance(120)
    Org.objects.create(slug="acme", cluster=handle.cluster, namespace=NS)
    api = kubernetes.config.new_client_from_config(config_file=handle.kubeconfig_path)
    yield handle, kubernetes.client.CustomObjectsApi(api), kubernetes.client.CoreV1Api(api)
    api.close()


def operator(client, *codenames) -> User:
    user = User.objects.create_user(f"op{User.objects.count()}", password="pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=("view_servedmodel",) + codenames))
    client.force_login(user)
    return user


def confirmation(page) -> dict[str, list[str]]:
    """What the confirmation page's form posts when its button is pressed: its hidden fields and the button."""
    form: dict[str, list[str]] = {"confirm": ["yes"]}
    for name, value in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', page.content.decode()):
        form.setdefault(name, []).append(value)
    return form


def revisions(crd) -> list[str]:
    items = crd.list_namespaced_custom_object("serving.knative.dev", "v1", NS, "revisions")["items"]
    return sorted(r["metadata"]["name"] for r in items if r["metadata"]["name"].startswith("zq86d3o"))


def model_pods(core) -> dict[str, str]:
    return {p.metadata.labels["serving.knative.dev/revision"]: p.status.phase
            for p in core.list_namespaced_pod(NS, label_selector="serving.kserve.io/inferenceservice=zq86d3o").items
            if not p.metadata.deletion_timestamp}


def the_model(handle) -> ServedModel:
    services.registry_sync(cluster=handle.cluster)
    return ServedModel.objects.get(name="zq86d3o")


def test_registry_sync_lists_models_and_pynodes_with_org_and_revisions(world):
    handle, crd, core = world
    rows = {(m.kind, m.name): m for m in services.registry_sync(cluster=handle.cluster)}
    assert set(rows) == {("InferenceService", "zq86d3o"), ("pynode", "pynode")}
    model = rows[("InferenceService", "zq86d3o")]
    assert model.org.slug == "acme" and model.framework == "vllm" and model.ready
    assert [(r["name"], r["ready"], r["gpus_held"]) for r in model.revisions] == \
        [("zq86d3o-predictor-00001", True, 1)]
    assert model.gpus_held == 1 and model.blocked == []


def test_seed_002_redeploy_goes_pending_and_deleting_the_old_revision_unblocks_it(world, client):
    handle, crd, core = world
    model = the_model(handle)
    user = operator(client, "redeploy_servedmodel")
    changelist = "/admin/capacity/servedmodel/"
    form = {"action": "redeploy", "_selected_action": [model.pk]}
    page = client.post(changelist, form)
    assert b"Redeploy these models?" in page.content                # confirmation first
    assert revisions(crd) == ["zq86d3o-predictor-00001"]
    client.post(changelist, confirmation(page))
    handle.advance(60)
    assert revisions(crd) == ["zq86d3o-predictor-00001", "zq86d3o-predictor-00002"]
    assert model_pods(core) == {"zq86d3o-predictor-00001": "Running", "zq86d3o-predictor-00002": "Pending"}

    model = the_model(handle)
    (blocked,) = model.blocked
    assert blocked["old_revision"] == "zq86d3o-predictor-00001"
    listing = client.get(changelist).content.decode()
    assert "the old revision zq86d3o-predictor-00001 (1 GPU) blocks a Pending one" in listing

    unblock = f"/admin/capacity/servedmodel/{model.pk}/unblock/zq86d3o-predictor-00001/"
    assert client.get(unblock).status_code == 403                     # its own permission
    user.user_permissions.add(Permission.objects.get(codename="delete_old_revision"))
    client.force_login(User.objects.get(pk=user.pk))
    confirm = client.get(unblock)
    assert b"NOT graceful" in confirm.content and revisions(crd)[0] == "zq86d3o-predictor-00001"
    assert f"(as the registry sync at {model.synced_at:%Y-%m-%d %H:%M:%S} UTC saw it; the cluster is read again " \
           "before anything is deleted)" in confirm.content.decode()
    client.post(unblock, {"confirm": "yes"})
    assert revisions(crd) == ["zq86d3o-predictor-00002"]
    handle.advance(120)
    assert model_pods(core) == {"zq86d3o-predictor-00002": "Running"}

    audit = list(RunbookAction.objects.order_by("at", "id").values_list("action", "actor__username", "target"))
    assert audit == [("model_redeploy", user.username, f"{NS}/zq86d3o"),
                     ("revision_delete_old", user.username, f"{NS}/zq86d3o-predictor-00001")]
    stopped = RunbookAction.objects.get(action="revision_delete_old").new["pods_stopped"]
    assert [name.startswith("zq86d3o-predictor-00001-deployment-") for name in stopped] == [True]
    # Each action done is in the audit trail once, with who asked, why, and before/after.
    entries = list(AuditEntry.objects.filter(app="runbook").order_by("at", "id"))
    assert [(e.action, e.actor.username, e.target) for e in entries] == audit
    assert entries[1].cause == "the operator deleted the old revision to unblock a Pending one"
    assert entries[1].new["pods_stopped"] == stopped and entries[1].subject_type == "runbook_action"

    # The detail pages show what was recorded as tables, not raw JSON.
    client.force_login(User.objects.filter(is_superuser=True).first() or User.objects.create_superuser("root"))
    row = RunbookAction.objects.get(action="revision_delete_old")
    detail = client.get(f"/admin/capacity/runbookaction/{row.pk}/change/").content.decode()
    assert 'class="json-table' in detail and stopped[0] in detail and '"pods_stopped"' not in detail
    detail = client.get(f"/admin/capacity/servedmodel/{model.pk}/change/").content.decode()
    assert 'class="json-table' in detail and "zq86d3o-predictor-00002" in detail


def test_redeploying_a_model_scaled_to_zero_says_first_that_it_will_start_pods(world, client):
    handle, crd, core = world
    model = the_model(handle)
    operator(client, "redeploy_servedmodel")
    form = {"action": "redeploy", "_selected_action": [model.pk]}
    assert b"holds no GPU now" not in client.post("/admin/capacity/servedmodel/", form).content
    ServedModel.objects.filter(pk=model.pk).update(                  # as a sync sees a model at zero
        gpus_held=0, revisions=[{**r, "pods_running": 0, "pods_pending": 0, "gpus_held": 0} for r in model.revisions])

    page = client.post("/admin/capacity/servedmodel/", form).content.decode()

    assert "It holds no GPU now (scaled to zero at the last registry sync): its new revision starts its initial " \
           "scale" in page
    assert "Some of these models are scaled to zero: redeploying starts pods for them for a while." in page
    assert revisions(crd) == ["zq86d3o-predictor-00001"], "nothing done before the confirmation"


def test_a_redeploy_confirmed_twice_redeploys_once_and_says_so(world, client):
    handle, crd, core = world
    model = the_model(handle)
    operator(client, "redeploy_servedmodel")
    changelist = "/admin/capacity/servedmodel/"
    page = client.post(changelist, {"action": "redeploy", "_selected_action": [model.pk]})
    assert f"{NS}/zq86d3o on {handle.cluster.name} (InferenceService): a new revision rolls out" \
        in page.content.decode()

    first = client.post(changelist, confirmation(page), follow=True)
    again = client.post(changelist, confirmation(page), follow=True)   # a double click, or back and resubmit
    handle.advance(60)

    assert revisions(crd) == ["zq86d3o-predictor-00001", "zq86d3o-predictor-00002"]
    assert RunbookAction.objects.filter(action="model_redeploy").count() == 1
    assert [str(m) for m in first.context["messages"]] == [f"{NS}/zq86d3o: redeploy started (a new revision rolls out)"]
    (said,) = [str(m) for m in again.context["messages"]]
    assert said.startswith(f"{NS}/zq86d3o: not redeployed again: a redeploy was asked since this confirmation was "
                           f"shown (at ") and " done at " in said


def test_redeploy_needs_its_permission(world, client):
    handle, crd, core = world
    model = the_model(handle)
    operator(client)                                                   # may view, not redeploy
    form = {"action": "redeploy", "_selected_action": [model.pk], "confirm": "yes"}
    client.post("/admin/capacity/servedmodel/", form)
    handle.advance(60)
    assert revisions(crd) == ["zq86d3o-predictor-00001"] and not RunbookAction.objects.exists()


def test_the_registry_offers_the_unblock_link_only_to_those_who_may_delete_an_old_revision(world, client):
    handle, crd, core = world
    model = the_model(handle)
    ServedModel.objects.filter(pk=model.pk).update(blocked=[{"old_revision": "zq86d3o-predictor-00001", "gpus_held": 1,
                                                             "reason": "its GPU is held by the old revision"}])
    unblock = f"/admin/capacity/servedmodel/{model.pk}/unblock/zq86d3o-predictor-00001/"

    operator(client)                                                   # may view the registry only
    page = client.get("/admin/capacity/servedmodel/").content.decode()
    assert unblock not in page
    assert "the old revision zq86d3o-predictor-00001 (1 GPU) blocks a Pending one: deleting it needs the " \
           "'delete old revision' permission" in page

    operator(client, "delete_old_revision")
    assert f'<a href="{unblock}">delete the old revision zq86d3o-predictor-00001 (1 GPU)</a>' in \
        client.get("/admin/capacity/servedmodel/").content.decode()


def test_deleting_an_old_revision_is_refused_once_nothing_is_blocked(world):
    handle, crd, core = world
    model = the_model(handle)
    with pytest.raises(services.RunbookRefused, match="not blocking"):
        services.revision_delete_old(model=model, revision="zq86d3o-predictor-00001", actor=None)
    assert revisions(crd) == ["zq86d3o-predictor-00001"]
    assert not RunbookAction.objects.exists()


SPEC = {"model": "zq86d3o", "gpu_count": "1", "gpu_product": A10G, "cpu_request": "2", "cpu_limit": "4",
        "memory_request": "8Gi", "memory_limit": "8Gi"}
ADD = "/admin/capacity/resourcespec/add/"


def test_saving_a_resource_spec_redeploys_the_model_with_it_and_records_it(world, client,
                                                                          django_capture_on_commit_callbacks):
    handle, crd, core = world
    the_model(handle)
    values = {"cluster": handle.cluster.pk, **SPEC}
    operator(client)
    assert client.post(ADD, values).status_code == 403                # needs add_resourcespec, preview included
    assert client.post(ADD, {**values, "confirm": "yes"}).status_code == 403
    user = operator(client, "add_resourcespec")
    assert client.post(ADD, values).templates[0].name == "capacity/resourcespec_preview.html"
    with django_capture_on_commit_callbacks(execute=True):   # the patches follow the spec's commit
        response = client.post(ADD, {**values, "confirm": "yes"})
    assert response.status_code == 302, response.content[:2000]
    isvc = crd.get_namespaced_custom_object("serving.kserve.io", "v1beta1", NS, "inferenceservices", "zq86d3o")
    resources = isvc["spec"]["predictor"]["model"]["resources"]
    assert resources["requests"] == {"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": "1"}
    handle.advance(5)
    assert revisions(crd)[-1] == "zq86d3o-predictor-00002"             # a new revision: a redeploy
    spec = ResourceSpec.objects.get()
    assert spec.created_by == user and spec.applied[0]["target"] == f"{NS}/zq86d3o"
    audit = RunbookAction.objects.get()
    assert (audit.action, audit.actor, audit.new["resources"]["limits"]["cpu"]) == ("resource_spec_apply", user, "4")
    assert audit.state == "done" and audit.old["resources"] != audit.new["resources"]


# --- a spec over several orgs: previewed, then confirmed ---------------------------------------------
OTHER_NS = "org-globex"


def two_orgs_scenario() -> list[dict]:
    """The same model deployed by two orgs: acme's asks for the generator's 8 CPUs / 64Gi, globex's
    already for exactly what SPEC sets."""
    globex = inference_service(OTHER_NS, "zq86d3o", product=A10G, gpus=1, min_replicas=1, max_replicas=1)
    globex["spec"]["predictor"]["model"]["resources"] = {
        "requests": {"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": "1"},
        "limits": {"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": "1"}}
    return scenario() + [namespace(OTHER_NS, org="globex"), globex]


@pytest.fixture
def two_orgs(sim_cluster_factory):
    handle = sim_cluster_factory(two_orgs_scenario())
    handle.advance(120)
    Org.objects.create(slug="acme", cluster=handle.cluster, namespace=NS)
    Org.objects.create(slug="globex", cluster=handle.cluster, namespace=OTHER_NS)
    services.registry_sync(cluster=handle.cluster)
    api = kubernetes.config.new_client_from_config(config_file=handle.kubeconfig_path)
    yield handle, kubernetes.client.CustomObjectsApi(api)
    api.close()


def isvc_state(crd) -> dict[str, tuple]:
    """What a patch would change on each version of the model: its generation and resources."""
    state = {}
    for ns in (NS, OTHER_NS):
        isvc = crd.get_namespaced_custom_object("serving.kserve.io", "v1beta1", ns, "inferenceservices", "zq86d3o")
        state[ns] = (isvc["metadata"]["generation"], isvc["spec"]["predictor"]["model"]["resources"])
    return state


def test_a_spec_over_two_orgs_is_previewed_per_org_and_model_and_nothing_is_written(two_orgs, client):
    handle, crd = two_orgs
    before = isvc_state(crd)
    operator(client, "add_resourcespec")
    page = client.post(ADD, {"cluster": handle.cluster.pk, **SPEC})
    assert page.status_code == 200 and page.templates[0].name == "capacity/resourcespec_preview.html"

    # Per org, per deployed version: what changes, old → new, as the operator reads it.
    orgs = {group["org"]: group["models"] for group in page.context["orgs"]}
    assert set(orgs) == {"acme", "globex"}
    (acme,), (globex,) = orgs["acme"], orgs["globex"]
    assert (acme["change"].target, acme["change"].redeploys) == (f"{NS}/zq86d3o", True)
    assert {a["resource"]: (a["request"], a["limit"], a["changed"]) for a in acme["amounts"]} == {
        "cpu": ("8 → 2", "8 → 4", True), "memory": ("64Gi → 8Gi", "64Gi → 8Gi", True),
        "nvidia.com/gpu": ("1 → 1", "1 → 1", False)}
    assert acme["gpu_product"] == f"{A10G} → {A10G}"
    assert (globex["change"].target, globex["change"].redeploys) == (f"{OTHER_NS}/zq86d3o", False)
    text = " ".join(page.content.decode().split())
    assert "Saving this spec would redeploy 1 of the 2 deployed version(s) of the model, in 1 org(s)" in text
    assert "Nothing has been saved or changed yet." in text
    assert "64Gi → 8Gi" in text and "already has these resources: left as it is" in text

    # Nothing written: no spec, no audit, neither InferenceService touched, no new revision.
    handle.advance(5)
    assert not ResourceSpec.objects.exists() and not RunbookAction.objects.exists()
    assert not AuditEntry.objects.exists()
    assert isvc_state(crd) == before and revisions(crd) == ["zq86d3o-predictor-00001"]

    # "No, change the spec" opens the form holding the values previewed.
    back = client.get(page.context["back_url"]).content.decode()
    assert 'name="cpu_request" value="2"' in back and 'name="model" value="zq86d3o"' in back


@pytest.mark.django_db(transaction=True)
def test_confirming_the_preview_redeploys_what_it_showed_audits_it_and_says_so(two_orgs, client):
    handle, crd = two_orgs
    before = isvc_state(crd)
    user = operator(client, "add_resourcespec")
    values = {"cluster": handle.cluster.pk, **SPEC}
    preview = client.post(ADD, values)
    form = {name: value for name, value in _hidden_inputs(preview.content.decode())}
    assert form.pop("confirm") == "yes" and form == {k: str(v) for k, v in values.items()}

    done = client.post(ADD, {**form, "confirm": "yes"}, follow=True)
    messages = [str(m) for m in done.context["messages"]]
    assert "redeploying 1 version(s) of zq86d3o; 1 already had these resources (left as they are)" in messages
    # Messages read as written: the model's name is not capitalised by the panel.
    assert "redeploying 1 version(s) of zq86d3o" in done.content.decode()
    after = isvc_state(crd)
    assert after[NS][1]["requests"] == {"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": "1"}
    assert after[NS][0] > before[NS][0]
    assert after[OTHER_NS] == before[OTHER_NS]                         # globex's was left as it is: no write
    action = RunbookAction.objects.get()                                 # one change, one action, one audit entry
    assert (action.action, action.actor, action.target, action.state) == (
        "resource_spec_apply", user, f"{NS}/zq86d3o", "done")
    (entry,) = AuditEntry.objects.filter(app="runbook")
    assert (entry.action, entry.actor, entry.target) == ("resource_spec_apply", user, f"{NS}/zq86d3o")
    assert entry.old["resources"]["requests"]["cpu"] == "8" and entry.new["resources"]["requests"]["cpu"] == "2"
    spec = ResourceSpec.objects.get()
    assert [(a["target"], a.get("unchanged", False)) for a in spec.applied] == [
        (f"{NS}/zq86d3o", False), (f"{OTHER_NS}/zq86d3o", True)]


def _hidden_inputs(html: str) -> list[tuple[str, str]]:
    form = html[html.index('<form method="post">', html.index('id="preview-table"')):]
    return [(m.group(1), m.group(2)) for m in re.finditer(r'<input type="hidden" name="([^"]+)" value="([^"]*)"',
                                                           form[:form.index("</form>")])
            if m.group(1) != "csrfmiddlewaretoken"]


@pytest.mark.parametrize("field, value, error", [
    ("cpu_request", "NaN", "'NaN' is not a positive Kubernetes quantity"),
    ("cpu_limit", "inf", "'inf' is not a positive Kubernetes quantity"),
    ("memory_request", "-8Gi", "'-8Gi' is not a positive Kubernetes quantity"),
    ("memory_limit", "0", "'0' is not a positive Kubernetes quantity"),
    ("cpu_request", "64", "the cpu request 64 is more than its limit 4"),
    ("memory_limit", "99999999999Ei", "99999999999Ei is more memory than any node of"),
    ("cpu_limit", "5000", "5000 is more cpu than any node of"),
    ("gpu_count", "1000", "at most 16 GPUs per pod, got 1000"),
    ("gpu_count", "-1", "Ensure this value is greater than or equal to 0."),
    ("model", "no-such-model", "no deployed InferenceService of model 'no-such-model'"),
])
def test_bad_input_is_refused_by_field_before_any_preview_and_changes_nothing(two_orgs, client, field, value, error):
    handle, crd = two_orgs
    before = isvc_state(crd)
    operator(client, "add_resourcespec")
    for confirm in ({}, {"confirm": "yes"}):
        page = client.post(ADD, {"cluster": handle.cluster.pk, **SPEC, field: value, **confirm})
        assert page.status_code == 200 and 'id="preview-table"' not in page.content.decode()
        assert any(error in message for message in page.context["adminform"].form.errors[field]), \
            page.context["adminform"].form.errors
    assert not ResourceSpec.objects.exists() and not RunbookAction.objects.exists()
    assert isvc_state(crd) == before


def test_a_model_stuck_deploying_is_deleted_with_what_it_left_on_confirmation(world, client):
    handle, crd, core = world
    stuck = inference_service(NS, "stuck", product="NVIDIA-B200", gpus=1)   # no such GPU: never Ready
    crd.create_namespaced_custom_object("serving.kserve.io", "v1beta1", NS, "inferenceservices", stuck)
    handle.advance(60)
    services.registry_sync(cluster=handle.cluster)
    stuck_row, ready_row = ServedModel.objects.get(name="stuck"), ServedModel.objects.get(name="zq86d3o")
    assert not stuck_row.ready
    changelist = "/admin/capacity/servedmodel/"
    form = {"action": "delete_stuck", "_selected_action": [stuck_row.pk, ready_row.pk]}
    operator(client)
    client.post(changelist, {**form, "confirm": "yes"})
    assert ServedModel.objects.get(pk=stuck_row.pk).gone is False     # no permission: nothing done
    user = operator(client, "delete_stuck_model")
    page = client.post(changelist, form)
    assert b"Delete these models stuck deploying?" in page.content and b"zq86d3o" not in page.content.split(
        b"<ul>")[1].split(b"</ul>")[0]
    client.post(changelist, {**form, "confirm": "yes"})
    handle.advance(60)
    isvcs = crd.list_namespaced_custom_object("serving.kserve.io", "v1beta1", NS, "inferenceservices")["items"]
    assert [i["metadata"]["name"] for i in isvcs] == ["zq86d3o"]      # the Ready one was left alone
    ksvcs = crd.list_namespaced_custom_object("serving.knative.dev", "v1", NS, "services")["items"]
    assert "stuck-predictor" not in {k["metadata"]["name"] for k in ksvcs}
    all_revs = crd.list_namespaced_custom_object("serving.knative.dev", "v1", NS, "revisions")["items"]
    assert not [r for r in all_revs if r["metadata"]["name"].startswith("stuck-")]
    audit = RunbookAction.objects.get()
    assert (audit.action, audit.actor, audit.target) == ("model_delete_stuck", user, f"{NS}/stuck")
    assert "InferenceService/stuck" in audit.new["deleted"]


def test_a_ready_model_is_not_deleted_as_stuck(world):
    handle, crd, core = world
    with pytest.raises(services.RunbookRefused, match="is Ready"):
        services.model_delete_stuck(model=the_model(handle), actor=None)
