"""`python -m bench quality`: the quality score (knowledge.quality) of the real model without
the help center, with it, and over a small sweep of system prompts and temperatures.

A private SQLite database gets the demo help center, really embedded; one vLLM engine runs in
this process and answers every run, its questions batched. The best configuration of the
sweep is what settings ship as CHAT_SYSTEM_PROMPT and GENERATION_TEMPERATURE.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from io import StringIO
from pathlib import Path
from typing import Any

# The system prompts tried: the one shipped before this benchmark, and two that ask for what
# the score checks (exact figures, the customer's language, brevity).
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
TEMPERATURES = (0.0, 0.3, 0.7)
BASELINE_PROMPT = "shop-assistant"
BASELINE_TEMPERATURE = 0.7


def _database(workdir: Path) -> None:
    os.environ["DATABASE_URL"] = f"sqlite:///{workdir / 'bench.sqlite3'}"
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", "--no-input", verbosity=0)
    demo = Path(__file__).resolve().parent.parent / "knowledge" / "demo_help_center"
    call_command("import_articles", str(demo), stdout=StringIO())


def _runs() -> list[dict[str, Any]]:
    runs = [
        {
            "name": "no help center",
            "prompt": BASELINE_PROMPT,
            "temperature": BASELINE_TEMPERATURE,
            "use_help_center": False,
        }
    ]
    for prompt in SYSTEM_PROMPTS:
        for temperature in TEMPERATURES:
            runs.append(
                {
                    "name": f"help center, {prompt}, T={temperature:g}",
                    "prompt": prompt,
                    "temperature": temperature,
                    "use_help_center": True,
                }
            )
    return runs


def quality() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-quality-") as workdir:
        _database(Path(workdir))
        from django.conf import settings

        from inference.engines import build_engine
        from knowledge.quality import (
            VariantSettings,
            answers_collect,
            engine_answerer,
            quality_prompts,
            quality_questions,
        )

        questions = quality_questions()
        runs = _runs()
        planned = []
        for run in runs:
            variant = VariantSettings(
                name=run["name"],
                assistant_prompt=SYSTEM_PROMPTS[run["prompt"]],
                temperature=run["temperature"],
                top_p=settings.GENERATION_TOP_P,
                max_tokens=settings.GENERATION_MAX_TOKENS,
                use_help_center=run["use_help_center"],
            )
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

                    score = await answers_collect(
                        prompts, variant=variant, answerer=answerer, progress=progress
                    )
                    elapsed = time.perf_counter() - started
                    print(
                        f"{run['name']:<45} overall {score.overall:.3f}  facts {score.facts:.3f}  "
                        f"source {score.sources:.3f}  don't know {score.dont_know:.3f}  "
                        f"language {score.language:.3f}  ({elapsed:.0f} s)",
                        flush=True,
                    )
                    rows.append(
                        {
                            **run,
                            **score.breakdown(),
                            "seconds": round(elapsed, 1),
                            "answers": {r.id: r.answer for r in score.results},
                        }
                    )
            finally:
                await engine.shutdown()
            return rows

        rows = asyncio.run(ask_all())
    swept = [row for row in rows if row["use_help_center"]]
    best = max(swept, key=lambda row: row["overall"])
    return {
        "model": os.path.basename(settings.INFERENCE_MODEL),
        "questions": len(questions),
        "unanswerable": sum(q.unanswerable for q in questions),
        "not_english": sum(q.language != "en" for q in questions),
        "system_prompts": SYSTEM_PROMPTS,
        "runs": rows,
        "best": {"prompt": best["prompt"], "temperature": best["temperature"], "overall": best["overall"]},
    }
