"""Number formats for the console: latencies, waits, memory, shares."""

from __future__ import annotations

from django import template

register = template.Library()

NO_DATA = "\N{EN DASH}"


@register.filter
def milliseconds(value: float | None) -> str:
    """142 ms, 1.4 s."""
    if value is None:
        return NO_DATA
    return f"{value:.0f} ms" if value < 1000 else f"{value / 1000:.1f} s"


@register.filter
def seconds(value: float | None) -> str:
    """0.4 s, 12 s, 3 min, 24 h."""
    if value is None:
        return NO_DATA
    if value < 10:
        return f"{value:.1f} s"
    if value < 120:
        return f"{value:.0f} s"
    if value < 7200:
        return f"{value / 60:.0f} min"
    return f"{value / 3600:.0f} h"


@register.filter
def gibibytes(value: int | None) -> str:
    if value is None:
        return NO_DATA
    return f"{value / 2**30:.1f} GiB" if value >= 2**30 else f"{value / 2**20:.0f} MiB"


@register.filter
def share(value: float | None) -> str:
    """A 0..1 share as a percentage: 0.314 -> 31.4%."""
    if value is None:
        return NO_DATA
    return f"{value * 100:.1f}%"


@register.filter
def get_item(mapping: dict, key: str) -> object:
    return mapping.get(key)


@register.filter
def audit_value(value: object) -> str:
    """A value as the audit log shows it: a canary plan as "5% for 300 s, then ...", blanks as a dash."""
    if value is None or value == "":
        return NO_DATA
    if isinstance(value, list) and all(isinstance(step, dict) and "percent" in step for step in value):
        return ", then ".join(f"{step['percent']}% for {step['hold_s']} s" for step in value)
    return str(value)


NOT_ENOUGH = "not enough data yet"


@register.filter
def rate_interval(interval: object) -> str:
    """A rate with its 95% interval, "31.4% (24.0-39.8%)", or that it means nothing yet (n)."""
    if not getattr(interval, "enough", False):
        return f"{NOT_ENOUGH} (n={getattr(interval, 'n', 0)})"
    return f"{interval.value * 100:.1f}% ({interval.low * 100:.1f}\N{EN DASH}{interval.high * 100:.1f}%)"


@register.filter
def mean_interval(interval: object) -> str:
    """A mean rating with its 95% interval, "4.2 (3.9-4.5)", or that it means nothing yet (n)."""
    if not getattr(interval, "enough", False):
        return f"{NOT_ENOUGH} (n={getattr(interval, 'n', 0)})"
    return f"{interval.value:.2f} ({interval.low:.2f}\N{EN DASH}{interval.high:.2f})"
