"""System checks for the inference worker's settings: its sequence slots, how it stops, and
which engine it runs.

`manage.py check` runs them, and so does every process when it starts (config/startup.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.db import DatabaseError

ENGINES = ("vllm", "simulated")
DTYPES = ("auto", "bfloat16", "float16", "float32")
# After the drain: handing unfinished jobs back, and the engine's own shutdown (about 5 s for
# vLLM on a CPU).
STOP_AFTER_DRAIN_S = 10.0


@register()
def sequence_slots_check(**kwargs: Any) -> list[CheckMessage]:
    slots = settings.INFERENCE_MAX_NUM_SEQS
    reserved = settings.VIP_RESERVED_SLOTS
    batch = settings.BATCH_MAX_SLOTS
    if slots < 1:
        return [
            Error(
                f"INFERENCE_MAX_NUM_SEQS = {slots}: the worker has no sequence slot to answer in.",
                hint="Set INFERENCE_MAX_NUM_SEQS to 1 or more (default 16).",
                id="inference.E001",
            )
        ]
    messages: list[CheckMessage] = []
    if not 0 <= reserved < slots:
        messages.append(
            Error(
                f"VIP_RESERVED_SLOTS = {reserved} of INFERENCE_MAX_NUM_SEQS = {slots} slots: "
                "normal and batch traffic can never take a slot, and waits until it expires.",
                hint="Set VIP_RESERVED_SLOTS below INFERENCE_MAX_NUM_SEQS, or raise INFERENCE_MAX_NUM_SEQS.",
                id="inference.E002",
            )
        )
        return messages
    if batch < 1:
        messages.append(
            Error(
                f"BATCH_MAX_SLOTS = {batch}: batch jobs are accepted but never answered.",
                hint="Set BATCH_MAX_SLOTS to 1 or more (default 4).",
                id="inference.E003",
            )
        )
    elif batch >= slots - reserved:
        messages.append(
            Warning(
                f"BATCH_MAX_SLOTS = {batch} lets batch jobs hold every slot that normal traffic "
                f"may use (INFERENCE_MAX_NUM_SEQS {slots} - VIP_RESERVED_SLOTS {reserved}): "
                "normal chat then waits behind batch jobs.",
                hint=f"Set BATCH_MAX_SLOTS below {slots - reserved}.",
                id="inference.W001",
            )
        )
    return messages


@register()
def worker_stop_check(**kwargs: Any) -> list[CheckMessage]:
    drain_s, grace_s = settings.WORKER_DRAIN_TIMEOUT_S, settings.WORKER_TERMINATION_GRACE_S
    if drain_s >= grace_s:
        return [
            Error(
                f"WORKER_DRAIN_TIMEOUT_S = {drain_s:g} s is not within the termination grace "
                f"(WORKER_TERMINATION_GRACE_S = {grace_s:g} s): a worker told to stop is killed "
                "while it drains, its answers restart elsewhere after their lease, and its engine "
                "is not shut down.",
                hint=(
                    f"Lower WORKER_DRAIN_TIMEOUT_S to {grace_s - STOP_AFTER_DRAIN_S:g} s or less, or "
                    "raise the process manager's grace and WORKER_TERMINATION_GRACE_S with it."
                ),
                id="inference.E004",
            )
        ]
    if grace_s - drain_s < STOP_AFTER_DRAIN_S:
        return [
            Warning(
                f"WORKER_DRAIN_TIMEOUT_S = {drain_s:g} s leaves {grace_s - drain_s:g} s of the "
                f"termination grace (WORKER_TERMINATION_GRACE_S = {grace_s:g} s) to hand jobs back "
                "and stop the engine, which may take longer.",
                hint=f"Keep WORKER_DRAIN_TIMEOUT_S {STOP_AFTER_DRAIN_S:g} s or more below the grace.",
                id="inference.W002",
            )
        ]
    return []


@register()
def generation_check(**kwargs: Any) -> list[CheckMessage]:
    messages: list[CheckMessage] = []
    if settings.INFERENCE_ENGINE not in ENGINES:
        messages.append(
            Error(
                f"INFERENCE_ENGINE = {settings.INFERENCE_ENGINE!r} is not an engine.",
                hint=f"Set INFERENCE_ENGINE to one of: {', '.join(ENGINES)}.",
                id="inference.E005",
            )
        )
    if settings.INFERENCE_DTYPE not in DTYPES:
        messages.append(
            Error(
                f"INFERENCE_DTYPE = {settings.INFERENCE_DTYPE!r} is not a dtype the engine computes in.",
                hint=f"Set INFERENCE_DTYPE to one of: {', '.join(DTYPES)} (default auto).",
                id="inference.E007",
            )
        )
    if settings.GENERATION_TIMEOUT_S <= 0:
        messages.append(
            Error(
                f"GENERATION_TIMEOUT_S = {settings.GENERATION_TIMEOUT_S:g} s: every answer times "
                "out before its first token.",
                hint="Set GENERATION_TIMEOUT_S above the longest answer you expect (default 120).",
                id="inference.E006",
            )
        )
    return messages


@register(Tags.database)
def served_model_check(*, databases: Iterable[str] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """A worker answers the variants whose model is its INFERENCE_MODEL_NAME: with none, it
    claims nothing (the variants name the model as it was called when they were made)."""
    if not databases or "default" not in databases:
        return []
    from scheduler.models import Variant

    try:
        models = set(Variant.objects.values_list("model", flat=True))
    except DatabaseError:
        return []  # not migrated yet: the migration names this model
    if not models or settings.INFERENCE_MODEL_NAME in models:
        return []
    return [
        Warning(
            f"INFERENCE_MODEL_NAME = {settings.INFERENCE_MODEL_NAME!r}, but no variant names this "
            f"model (they name {', '.join(sorted(models))}): a worker started so answers nothing.",
            hint="Set INFERENCE_MODEL_NAME to a variant's model, or change a variant's model in the "
            "console (Variants).",
            id="inference.W003",
        )
    ]
