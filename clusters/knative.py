"""What Knative Serving's cluster-wide `config-autoscaler` says about a new Revision's
initial scale, as the features that switch a Knative Service's min-scale read it (the
dormancy switch of pynodes, `orgs`; the idle-GPU pruner, `pruning`).

Pure: the gateway read is `clusters.selectors.knative_initial_scale_read`.

A template change makes a new Revision, which starts `initial-scale` pods (1 by default)
before the autoscaler may take it to zero. Knative's webhook accepts a template's
`initial-scale: "0"` only where config-autoscaler sets `allow-zero-initial-scale` to a
true value (Go's `strconv.ParseBool`); otherwise the "0" is refused, so a feature may set
it only when `InitialScale.zero_allowed`. Each feature words its own consequence from
`cause` (why) and `pods` (what a new revision starts otherwise).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from clusters.labels import INITIAL_SCALE, INITIAL_SCALE_LEGACY, MIN_SCALE, MIN_SCALE_LEGACY

KNATIVE_NAMESPACE = "knative-serving"
AUTOSCALER_CONFIG_NAME = "config-autoscaler"
AUTOSCALER_CONFIG = f"{KNATIVE_NAMESPACE}/{AUTOSCALER_CONFIG_NAME}"
ALLOW_ZERO_INITIAL_SCALE = "allow-zero-initial-scale"
# Knative reads its ConfigMap flags with Go's strconv.ParseBool.
_GO_TRUE = {"1", "t", "T", "TRUE", "true", "True"}


@dataclass(frozen=True)
class InitialScale:
    """Whether a template may carry initial-scale "0" on this cluster, and why.

    `cause`: the evidence, as an operator reads it ("" = not read at all);
    `pods`: what a new Revision starts when its template sets no initial scale (the
    cluster's `initial-scale`), "" when that is not known (the ConfigMap was unreadable);
    `error`: why the ConfigMap could not be read ("" = it was, or it does not exist)."""

    zero_allowed: bool
    cause: str
    pods: str = "1"
    error: str = ""

    @property
    def known(self) -> bool:
        return bool(self.cause)

    @property
    def readable(self) -> bool:
        return not self.error


INITIAL_SCALE_UNKNOWN = InitialScale(False, "", "")


def initial_scale_from_config(*, config: dict | None, error: str = "") -> InitialScale:
    """From config-autoscaler's `data` (None: no such ConfigMap, Knative's defaults), or
    the reason it could not be read (`error`: then a zero initial scale counts as not
    allowed, which is what a write without it relies on)."""
    if error:
        return InitialScale(False, f"{AUTOSCALER_CONFIG} could not be read ({error})", "", error)
    data = config or {}
    flag = data.get(ALLOW_ZERO_INITIAL_SCALE)
    pods = (data.get("initial-scale") or "1").strip()
    if flag in _GO_TRUE:
        return InitialScale(True, f"{AUTOSCALER_CONFIG} allows a zero initial scale "
                                  f"({ALLOW_ZERO_INITIAL_SCALE}: {flag!r})", pods)
    if config is None:
        cause = f"no {AUTOSCALER_CONFIG} (Knative's defaults)"
    elif flag is None:
        cause = f"{AUTOSCALER_CONFIG} has no {ALLOW_ZERO_INITIAL_SCALE}"
    else:
        cause = f"{AUTOSCALER_CONFIG} sets {ALLOW_ZERO_INITIAL_SCALE}: {flag!r}"
    return InitialScale(False, cause, pods)


def initial_scale_key(annotations: Mapping) -> str:
    """The initial-scale key a template uses: its old camelCase spelling only where that
    alone is set (a second key beside it would be ambiguous), else the current one."""
    return INITIAL_SCALE_LEGACY if INITIAL_SCALE not in annotations and INITIAL_SCALE_LEGACY in annotations \
        else INITIAL_SCALE


def min_scale_key(annotations: Mapping) -> str:
    """The min-scale key an object (or a template) uses: its old camelCase spelling only
    where that alone is set, else the current one. Knative refuses both spellings on one
    object, so a write goes to the owner's own key."""
    return MIN_SCALE_LEGACY if MIN_SCALE not in annotations and MIN_SCALE_LEGACY in annotations else MIN_SCALE


def min_scale_current(annotations: Mapping) -> str | None:
    """The min-scale an object asks for, under either spelling (the current one first,
    as Knative reads them); None when it sets none."""
    value = annotations.get(MIN_SCALE)
    return annotations.get(MIN_SCALE_LEGACY) if value is None else value


def scale_count(value) -> int | None:
    """A scale annotation's value as a count of pods; None when it is not a whole number."""
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return None


def revision_initial_pods(initial: InitialScale, template: Mapping) -> tuple[int | None, str]:
    """What a new Revision of a template with these annotations starts before its
    autoscaler may act, and from where (Knative's GetInitialScale: the template's own
    initial-scale, a "0" only where the cluster allows it, else the cluster's
    `initial-scale`). (None, …) when config-autoscaler was not read and the template says
    nothing of its own."""
    own = scale_count(template.get(initial_scale_key(template)))
    if own is not None and (own >= 1 or (own == 0 and initial.zero_allowed)):
        return own, "its template's initial-scale"
    cluster = scale_count(initial.pods)
    if cluster is not None:
        return cluster, "the cluster's initial-scale"
    return None, "the cluster's initial-scale, 1 by default, as config-autoscaler could not be read"
