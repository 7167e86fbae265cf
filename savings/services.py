"""Writes of the savings app: the price per GPU-hour of a GPU model, set or removed,
audited with its old and new value."""
from __future__ import annotations

import re
from datetime import datetime
from decimal import Decimal, InvalidOperation

from django.db import transaction

from audit.services import audit
from savings.models import GpuPrice

# A Kubernetes label value (the node label nvidia.com/gpu.product): 63 characters at most,
# alphanumerics with - _ . inside (k8s.io/apimachinery validation.IsValidLabelValue).
_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
PRICE_MAX = Decimal("99999999.9999")   # DecimalField(max_digits=12, decimal_places=4)


class PriceInputError(ValueError):
    """A GPU model or price that cannot be stored; the message names what is wrong."""


def gpu_model_parse(text: object) -> str:
    value = str(text if text is not None else "").strip()
    if not value:
        raise PriceInputError("GPU model is empty: give it as its nodes' label nvidia.com/gpu.product says it, "
                              "e.g. NVIDIA-H100-80GB-HBM3")
    if not _LABEL_VALUE.fullmatch(value):
        raise PriceInputError(f"GPU model {value!r} is not a node label value (nvidia.com/gpu.product): up to 63 "
                              f"letters, digits, '-', '_' or '.', starting and ending with a letter or digit")
    return value


def price_parse(text: object) -> Decimal:
    """A price per GPU-hour: a plain, finite number, 0 or more, at most 4 decimals."""
    raw = str(text if text is not None else "").strip()
    if not raw:
        raise PriceInputError("price per GPU-hour is empty: give a number such as 2.50 (0 or more); to leave a "
                              "GPU model without a price, delete its row")
    try:
        value = Decimal(raw)
    except InvalidOperation:
        raise PriceInputError(f"price per GPU-hour must be a number such as 2.50, got {raw!r}") from None
    if not value.is_finite():
        raise PriceInputError(f"price per GPU-hour must be a finite number, got {raw!r}")
    if value < 0:
        raise PriceInputError(f"price per GPU-hour must be 0 or more, got {raw}")
    if value > PRICE_MAX:
        raise PriceInputError(f"price per GPU-hour must be at most {PRICE_MAX}, got {raw}")
    if value != value.quantize(Decimal("0.0001")):
        raise PriceInputError(f"price per GPU-hour has at most 4 decimals, got {raw}")
    return value.quantize(Decimal("0.0001"))


def gpu_price_set(*, gpu_model: object, price: object, actor, now: datetime, currency: str) -> GpuPrice:
    """Set the price of `gpu_model` (created when it has none). Bad input raises
    PriceInputError and changes nothing; the same price again writes nothing."""
    model, value = gpu_model_parse(gpu_model), price_parse(price)
    with transaction.atomic():
        row = GpuPrice.objects.select_for_update().filter(gpu_model=model).first()
        old = None if row is None else row.price_per_gpu_hour
        if old is not None and old == value:
            return row
        if row is None:
            row = GpuPrice(gpu_model=model)
        row.price_per_gpu_hour, row.updated_at = value, now
        row.save()
        audit(app="savings", action="gpu_price_set", at=now, actor=actor, target=f"GpuPrice/{model}",
              cause=f"price per GPU-hour of {model} set", subject=("gpu_price", row.pk),
              old={"gpu_model": model, "price_per_gpu_hour": "no price" if old is None else str(old),
                   "currency": currency},
              new={"gpu_model": model, "price_per_gpu_hour": str(value), "currency": currency})
    return row


def gpu_price_delete(*, price: GpuPrice, actor, now: datetime, currency: str) -> None:
    """Remove a GPU model's price: from then on its savings are shown as "no price"."""
    with transaction.atomic():
        pk, model, old = price.pk, price.gpu_model, price.price_per_gpu_hour
        price.delete()
        audit(app="savings", action="gpu_price_deleted", at=now, actor=actor, target=f"GpuPrice/{model}",
              cause=f"price per GPU-hour of {model} removed (now shown as no price)", subject=("gpu_price", pk),
              old={"gpu_model": model, "price_per_gpu_hour": str(old), "currency": currency},
              new={"gpu_model": model, "price_per_gpu_hour": "no price", "currency": currency})
