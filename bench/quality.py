"""`python -m bench quality`: the quality score (knowledge.quality) of the real model with the
chat's default variant: without the help center, with it (and, for comparison, with the model
itself telling customers it does not know, instead of the help center's reply), and with it
through the result cache as customers are served; `--sweep` adds a sweep of system prompts,
frequency penalties and temperatures.

A private SQLite database gets the demo help center, really embedded; one vLLM engine runs in
this process and answers every run, its questions batched. The sweep's best configuration is
what settings ship as CHAT_SYSTEM_PROMPT, GENERATION_TEMPERATURE and
GENERATION_FREQUENCY_PENALTY.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import tempfile
import time
from io import StringIO
from pathlib import Path
from typing import Any

# The system prompts the sweep tries: the one shipped before this benchmark, and two that ask
# for what the score checks (exact figures, the customer's language, brevity).
SYSTEM_PROMPTS = {
    "shop-assistant": (
        "You are the customer-service assistant of an online shop. Answer in a few sentences."
    ),
    "exact-figures": (
        "You are the customer-service assistant of Larkspur Home, an online shop. Answer in one "
        "or two short sentences and give the exact figures (prices, days, percentages) from the "
        "help center. Always reply in the language of the customer's message."
    ),
    "brief-same-language": (
        "You are a customer-service assistant. Reply in the same language as the customer, "
        "briefly and exactly."
    ),
}
FREQUENCY_PENALTIES = (0.0, 0.5, 1.0, 1.5)
TEMPERATURES = (0.3, 0.7)  # swept at the default prompt and penalty; the rest at 0
NO_HELP_CENTER = "no help center"
HELP_CENTER = "help center"
MODEL_SAYS_UNKNOWN = "help center, the model says it does not know"
THROUGH_CACHE = "help center + result cache"


def _database(workdir: Path) -> None:
    os.environ["DATABASE_URL"] = f"sqlite:///{workdir / 'bench.sqlite3'}"
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", "--no-input", verbosity=0)
    demo = Path(__file__).resolve().parent.parent / "knowledge" / "demo_help_center"
    call_command("import_articles", str(demo), stdout=StringIO())


def _sweep_runs(default_penalty: float) -> list[dict[str, Any]]:
    greedy = [
        {"prompt": prompt, "temperature": 0.0, "frequency_penalty": penalty}
        for prompt in SYSTEM_PROMPTS
        for penalty in FREQUENCY_PENALTIES
    ]
    sampled = [
        {"prompt": "default", "temperature": temperature, "frequency_penalty": default_penalty}
        for temperature in TEMPERATURES
    ]
    return [
        {
            **run,
            "name": f"help center, {run['prompt']}, T={run['temperature']:g}, "
            f"penalty {run['frequency_penalty']:g}",
            "use_help_center": True,
        }
        for run in greedy + sampled
    ]


def _served_detail(cached: dict[str, Any], fresh: dict[str, Any]) -> list[dict[str, Any]]:
    """Each question the cache answered in the row `cached`: how it matched, whose answer it got
    (the misses that wrote the same text), and its grade against the one the model earned for it
    without the cache (the row `fresh`)."""
    served = cached["cache"]["served"]
    through_cache = {r["id"]: r for r in cached["results"]}
    without_cache = {r["id"]: r for r in fresh["results"]}
    return [
        {
            "id": question_id,
            "match": match,
            "served_from": [
                r["id"]
                for r in through_cache.values()
                if r["id"] not in served and r["answer"] == through_cache[question_id]["answer"]
            ],
            "through_cache": through_cache[question_id],
            "without_cache": without_cache[question_id.removesuffix("#again")],
        }
        for question_id, match in served.items()
    ]


def quality(*, sweep: bool = False, cache_similarities: tuple[float, ...] = ()) -> dict[str, Any]:
    """`cache_similarities`: the thresholds of semantic matches to run the cache's row at
    (default: ANSWER_CACHE_MIN_SIMILARITY alone)."""
    with tempfile.TemporaryDirectory(prefix="bench-quality-") as workdir:
        _database(Path(workdir))
        from django.conf import settings
        from django.test import override_settings

        from bench.answering import cached_answers_collect, engine_answerer
        from inference.engines import build_engine
        from knowledge.quality import VariantSettings, answers_collect, quality_prompts, quality_questions
        from scheduler.models import Variant

        questions = quality_questions()
        # The chat's default variant, as the migrations write it from the settings.
        stable = Variant.objects.get(name="stable")
        default = VariantSettings.of(stable)
        similarities = cache_similarities or (settings.ANSWER_CACHE_MIN_SIMILARITY,)
        runs: list[dict[str, Any]] = [
            {"name": NO_HELP_CENTER, "use_help_center": False},
            {"name": HELP_CENTER, "use_help_center": True},
            {"name": MODEL_SAYS_UNKNOWN, "use_help_center": True, "unknown_reply": False},
        ]
        for similarity in similarities:
            name = THROUGH_CACHE
            if similarity != settings.ANSWER_CACHE_MIN_SIMILARITY:
                name += f", similarity >= {similarity:g}"
            runs.append({"name": name, "use_help_center": True, "cache_similarity": similarity})
        for run in runs:
            run.update(
                prompt="default",
                temperature=default.temperature,
                frequency_penalty=default.frequency_penalty,
            )
        if sweep:
            runs += _sweep_runs(default.frequency_penalty)
        planned = []
        for n, run in enumerate(runs):
            if "cache_similarity" in run:
                # A variant of its own per threshold, the same in all but its name, so that each
                # row starts with an empty cache.
                cache_variant = Variant.objects.get(pk=stable.pk)
                cache_variant.pk, cache_variant.name = None, f"{stable.name}-cache-{n}"
                cache_variant.save()
                planned.append((run, cache_variant, []))
                continue
            variant = dataclasses.replace(
                default,
                name=run["name"],
                use_help_center=run["use_help_center"],
                unknown_reply=run.get("unknown_reply", default.unknown_reply),
                temperature=run["temperature"],
                frequency_penalty=run["frequency_penalty"],
            )
            if run["prompt"] != "default":
                variant = dataclasses.replace(variant, assistant_prompt=SYSTEM_PROMPTS[run["prompt"]])
            planned.append((run, variant, quality_prompts(variant=variant, questions=questions)))

        async def ask_all() -> list[dict[str, Any]]:
            engine = build_engine()
            print(f"starting {engine.label} in this process...", flush=True)
            await engine.start()
            answerer = engine_answerer(engine)
            rows = []
            try:
                for n, (run, variant, prompts) in enumerate(planned, 1):
                    started = time.perf_counter()

                    def progress(done: int, total: int, n: int = n) -> None:
                        if done % 12 == 0 or done == total:
                            print(f"  run {n}/{len(planned)}: {done}/{total} answered", flush=True)

                    cache: dict[str, Any] | None = None
                    if isinstance(variant, Variant):
                        with override_settings(ANSWER_CACHE_MIN_SIMILARITY=run["cache_similarity"]):
                            cached = await cached_answers_collect(
                                questions, variant=variant, engine=engine, progress=progress
                            )
                        score = cached.score
                        cache = {
                            "hits": len(cached.served),
                            "hit_rate": cached.hit_rate,
                            "served": cached.served,
                        }
                    else:
                        score = await answers_collect(
                            prompts, variant=variant, answerer=answerer, progress=progress
                        )
                    elapsed = time.perf_counter() - started
                    hits = f"  hits {cache['hits']}/{score.questions}" if cache is not None else ""
                    print(
                        f"{run['name']:<45} overall {score.overall:.3f}  facts {score.facts:.3f}  "
                        f"source {score.sources:.3f}  don't know {score.dont_know:.3f}  "
                        f"language {score.language:.3f}  readable {score.readable:.3f}{hits}  "
                        f"({elapsed:.0f} s)",
                        flush=True,
                    )
                    row = {
                        **run,
                        **score.breakdown(),
                        "seconds": round(elapsed, 1),
                        "results": [dataclasses.asdict(result) for result in score.results],
                    }
                    if cache is not None:
                        row["cache"] = cache
                    rows.append(row)
            finally:
                await engine.shutdown()
            return rows

        rows = asyncio.run(ask_all())
    fresh = next(row for row in rows if row["name"] == HELP_CENTER)
    for row in rows:
        if "cache" in row:
            row["cache"]["served_questions"] = _served_detail(row, fresh)
    report: dict[str, Any] = {
        "model": os.path.basename(settings.INFERENCE_MODEL),
        "questions": len(questions),
        "unanswerable": sum(q.unanswerable for q in questions),
        "not_english": sum(q.language != "en" for q in questions),
        "default_variant": default.as_dict(),
        "cache_min_similarity": settings.ANSWER_CACHE_MIN_SIMILARITY,
        "runs": rows,
    }
    if sweep:
        swept = [row for row in rows if row["name"].startswith("help center, ") and "penalty" in row["name"]]
        best = max(swept, key=lambda row: row["overall"])
        report["system_prompts"] = SYSTEM_PROMPTS
        report["best"] = {
            "prompt": best["prompt"],
            "temperature": best["temperature"],
            "frequency_penalty": best["frequency_penalty"],
            "overall": best["overall"],
        }
    return report
