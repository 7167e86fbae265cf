from __future__ import annotations


def value(samples: dict, name: str, **labels) -> float:
    """A sample's value, 0 when absent (a counter not yet incremented)."""
    return samples.get((name, frozenset(labels.items())), 0.0)
