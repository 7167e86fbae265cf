"""Writes for the cluster registry and the beat schedules."""
from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.db import transaction

from audit.services import audit
from clusters import kube
from clusters.models import Cluster
from config.actors import actor_label_current
from config.records import RecordsKept, records_kept_message, records_naming
from config.schedule import SCHEDULES

_CONNECTION = ("kubeconfig_path", "kube_context", "in_cluster")   # what the gateway is built from


def cluster_sync_default() -> Cluster | None:
    """Create or update the default cluster from KUBECONFIG / KUBE_CONTEXT / in-cluster.

    Returns None when the environment names no cluster (then the registry decides).
    IMPORTANT: new connection settings are loaded before they are saved: settings that do
    not load raise `ConfigError` and leave the row as it was, so one command started with a
    wrong KUBECONFIG cannot cut every worker off the cluster.
    """
    if not settings.KUBECONFIG and not settings.KUBE_IN_CLUSTER:
        return None
    wanted = {
        "kubeconfig_path": "" if settings.KUBE_IN_CLUSTER else settings.KUBECONFIG.split(":")[0],
        "kube_context": settings.KUBE_CONTEXT,
        "in_cluster": settings.KUBE_IN_CLUSTER,
        "prometheus_url": settings.PROMETHEUS_URL,
        "prometheus_token_env": settings.PROMETHEUS_TOKEN_ENV if settings.PROMETHEUS_URL else "",
        "from_environment": True,
    }
    cluster = Cluster.objects.filter(name=settings.DEFAULT_CLUSTER_NAME).first()
    if cluster is None or any(getattr(cluster, field) != wanted[field] for field in _CONNECTION):
        # Raises ConfigError naming the file and context; nothing is asked of the cluster.
        kube.gateway_for(Cluster(name=settings.DEFAULT_CLUSTER_NAME, **wanted))
    if cluster is None:
        cluster, _ = Cluster.objects.get_or_create(name=settings.DEFAULT_CLUSTER_NAME, defaults=wanted)
        return cluster
    changed = [field for field, value in wanted.items() if getattr(cluster, field) != value]
    if changed:
        for field in changed:
            setattr(cluster, field, wanted[field])
        cluster.save(update_fields=changed)
    return cluster


def cluster_resolve(*, name: str | None = None) -> Cluster:
    """The named cluster, or the default one. The default is first brought in line with the
    environment (KUBECONFIG / KUBE_CONTEXT / in-cluster), which may create or update its row:
    a write, hence a service. An unknown name raises `Cluster.DoesNotExist` naming the known ones."""
    if name is None or name == settings.DEFAULT_CLUSTER_NAME:
        default = cluster_sync_default()
        if default is not None:
            return default
        name = name or settings.DEFAULT_CLUSTER_NAME
    try:
        return Cluster.objects.get(name=name)
    except Cluster.DoesNotExist:
        known = ", ".join(Cluster.objects.values_list("name", flat=True)) or "none"
        retired = Cluster.all_objects.filter(name=name).exclude(retired_at=None).order_by("-retired_at").first()
        if retired is not None:
            raise Cluster.DoesNotExist(f"cluster {name!r} is retired (since {retired.retired_at:%Y-%m-%d %H:%M} UTC): "
                                       f"no act reaches it (in service: {known})") from None
        raise Cluster.DoesNotExist(f"no cluster named {name!r} (known: {known})") from None


def cluster_lock(*, cluster: Cluster) -> None:
    """Lock the cluster's row until the surrounding transaction ends: a writer that counts
    what runs on the cluster before adding to it (defrag's per-cluster job limit) holds it
    so that two requests cannot both pass the count. Call inside `transaction.atomic()`."""
    # all_objects: the lock serialises writers and decides nothing about whether the cluster
    # is in service (what acts reaches only clusters in service through `objects`); a
    # rehearsal's copy, registered retired, is acted on under the same lock.
    Cluster.all_objects.select_for_update().only("pk").get(pk=cluster.pk)


def schedules_install(*, using: str = "default") -> list[str]:
    """Write config/schedule.py into django-celery-beat; rows an operator already tuned
    keep their interval and enabled flag, rows still at an interval an earlier release
    installed (`former_every_seconds`) move to the current one. Returns the names created."""
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    created = []
    with transaction.atomic(using=using):
        for periodic in SCHEDULES:
            interval, _ = IntervalSchedule.objects.using(using).get_or_create(
                every=periodic.every_seconds, period=IntervalSchedule.SECONDS)
            installed = PeriodicTask.objects.using(using).filter(name=periodic.name).select_related("interval").first()
            if installed is not None:
                old = installed.interval
                if old is not None and old.period == IntervalSchedule.SECONDS \
                        and old.every in periodic.former_every_seconds:
                    installed.interval, installed.description = interval, periodic.description
                    installed.save(update_fields=["interval", "description"])
                continue
            PeriodicTask.objects.using(using).create(
                name=periodic.name, task=periodic.task, interval=interval,
                description=periodic.description, priority=periodic.priority)
            created.append(periodic.name)
    return created


def _connection(cluster: Cluster) -> dict:
    return {"name": cluster.name, "kubeconfig_path": cluster.kubeconfig_path, "kube_context": cluster.kube_context,
            "in_cluster": cluster.in_cluster, "prometheus_url": cluster.prometheus_url}


def cluster_retire(*, cluster: Cluster, actor, now: datetime, cause: str = "") -> list[str]:
    """Retire a cluster that is gone: kept with its history, out of every list and periodic
    job that acts; its orgs in service are retired with it (each audited). Nothing is sent
    to the cluster. Returns the slugs of the orgs retired with it; an already retired
    cluster is left as it is ([])."""
    with transaction.atomic():
        locked = Cluster.all_objects.select_for_update().get(pk=cluster.pk)
        if locked.retired:
            return []
        label = "" if actor is not None else actor_label_current()
        Cluster.all_objects.filter(pk=cluster.pk).update(retired_at=now, retired_by=actor, retired_by_label=label)
        audit(app="clusters", action="cluster_retired", at=now, actor=actor, cause=cause or "retired by an operator",
              target=f"Cluster/{locked.name}", cluster=locked, subject=("cluster", locked.pk),
              old={"retired_at": None}, new={"retired_at": now.isoformat()})
        orgs = list(locked.orgs.filter(retired_at__isnull=True).order_by("slug"))
        for org in orgs:
            type(org).all_objects.filter(pk=org.pk).update(retired_at=now, retired_by=actor, retired_by_label=label)
            audit(app="orgs", action="org_retired", at=now, actor=actor, cause=f"its cluster {locked.name} was retired",
                  target=f"Org/{org.slug}", org=org, subject=("org", org.pk),
                  old={"retired_at": None}, new={"retired_at": now.isoformat()})
    cluster.retired_at, cluster.retired_by, cluster.retired_by_label = now, actor, label
    return [org.slug for org in orgs]


def cluster_copy_register(*, name: str, kubeconfig_path: str, actor, now: datetime, cause: str) -> Cluster:
    """Register a copy of a cluster (a simulated cluster loaded from a dump, for a rehearsal)
    so that services can act on it as on any cluster: created retired in one transaction, so
    no list, lookup by name or periodic job that acts ever reaches it, and what is done on it
    stays in history under its own name. The retirement is audited with `cause`."""
    with transaction.atomic():
        copy = Cluster.all_objects.create(name=name, kubeconfig_path=kubeconfig_path)
        cluster_retire(cluster=copy, actor=actor, now=now, cause=cause)
    return copy


def cluster_delete(*, cluster: Cluster, actor, now: datetime) -> None:
    """Delete a cluster row nothing names (registered by mistake, never used), audited.
    Raises `RecordsKept` saying what names it otherwise: such a cluster is retired instead."""
    with transaction.atomic():
        locked = Cluster.all_objects.select_for_update().get(pk=cluster.pk)
        kept = records_naming(locked)
        if kept:
            raise RecordsKept(records_kept_message(locked, kept))
        old = _connection(locked)
        pk = locked.pk
        locked.delete()
        # The entry names the cluster by text only: a foreign key would name a row that is gone.
        audit(app="clusters", action="cluster_deleted", at=now, actor=actor, cause="it named no record",
              target=f"Cluster/{old['name']}", subject=("cluster", pk), old=old, new={})
