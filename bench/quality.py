"""`python -m bench quality`: the quality score (knowledge.quality) of each answer style on the
question sets, measured as the chat answers: the help center's own sentences (extractive), the
model's answer checked sentence by sentence (verified), the model's answer unchecked
(generated). For each, per set (tuning, held-out, and the fresh set never used to tune): answered
right, declined right, answers with an invented fact, answers in the customer's language; and
the time to the first text a customer is shown, and the model's tokens/s, against `generated`.

A private SQLite database gets the demo help center (four languages, really embedded); one vLLM
engine runs in this process and answers the model styles (16 conversations at a time, so it
batches), a verified answer checked with the worker's own knowledge.grounding.AnswerChecker.
Every style runs `--runs` times (three by default); each figure is reported as the median and
the spread of the runs. Greedy decoding gives the same answers each run: the spread is the
machine's, in the timings.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import statistics
import tempfile
import time
import uuid
from io import StringIO
from pathlib import Path
from typing import Any

from bench.stats import percentile

STYLES = ("extractive", "verified", "generated")
PARTS = ("answered_right", "declined_right", "invented", "language")


def _database(workdir: Path) -> None:
    os.environ["DATABASE_URL"] = f"sqlite:///{workdir / 'bench.sqlite3'}"
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", "--no-input", verbosity=0)
    demo = Path(__file__).resolve().parent.parent / "knowledge" / "demo_help_center"
    started = time.perf_counter()
    call_command("import_articles", str(demo), stdout=StringIO())
    print(f"imported the demo help center in {time.perf_counter() - started:.0f} s", flush=True)


@dataclasses.dataclass
class _EngineUse:
    """What the model styles' answers cost the engine: output tokens and seconds of answering."""

    tokens: int = 0
    seconds: float = 0.0


def engine_answerer(engine: Any, use: _EngineUse) -> Any:
    """Answers from an engine in this process, as a worker does: a verified answer is shown
    sentence by sentence once checked (knowledge.grounding), and the time to its first shown
    text is its TTFT."""
    from inference.engines.base import GenerationRequest
    from knowledge.grounding import AnswerChecker
    from knowledge.quality import ModelAnswer

    async def answer(messages, sampling, grounding) -> ModelAnswer:
        request = GenerationRequest(
            request_id=f"quality-{uuid.uuid4()}", messages=messages, sampling=sampling
        )
        checker = AnswerChecker(grounding) if grounding is not None else None
        started = time.perf_counter()
        ttft_ms = None
        shown: list[str] = []
        finish_reason = None
        output_tokens = 0
        async for delta in engine.generate(request):
            text = delta.text if checker is None else checker.feed(delta.text)
            if text and ttft_ms is None:
                ttft_ms = (time.perf_counter() - started) * 1000
            shown.append(text)
            finish_reason = delta.finish_reason or finish_reason
            output_tokens = delta.output_tokens
        if checker is not None:
            rest = checker.finish(cut_off=finish_reason == "length")
            if rest and ttft_ms is None:
                ttft_ms = (time.perf_counter() - started) * 1000
            shown.append(rest)
        use.tokens += output_tokens
        use.seconds += time.perf_counter() - started
        declined = checker is not None and checker.declined
        return ModelAnswer("".join(shown), declined=declined, ttft_ms=ttft_ms)

    return answer


def _spread(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 4),
        "min": round(min(values), 4),
        "max": round(max(values), 4),
    }


def quality(*, styles: tuple[str, ...] = STYLES, runs: int = 3) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-quality-") as workdir:
        _database(Path(workdir))
        from django.conf import settings

        from knowledge.quality import VariantSettings, answers_collect, conversations_load
        from scheduler.models import Variant

        conversations = conversations_load()
        turns = sum(len(c.turns) for c in conversations)
        stable = VariantSettings.of(Variant.objects.get(name="stable"))
        model_styles = [style for style in styles if style != "extractive"]

        async def ask_all() -> dict[str, list[dict[str, Any]]]:
            engine = None
            if model_styles:
                from inference.engines import build_engine

                engine = build_engine()
                print(f"starting {engine.label} in this process...", flush=True)
                await engine.start()
            measured: dict[str, list[dict[str, Any]]] = {style: [] for style in styles}
            try:
                for run in range(1, runs + 1):
                    for style in styles:
                        use = _EngineUse()
                        answerer = engine_answerer(engine, use) if engine is not None else None
                        variant = dataclasses.replace(stable, answer_style=style)
                        started = time.perf_counter()

                        def progress(done: int, total: int, style: str = style, run: int = run) -> None:
                            if done % 40 == 0 or done == total:
                                print(f"  run {run}/{runs} {style}: {done}/{total} answered", flush=True)

                        score = await answers_collect(
                            conversations, variant=variant, answerer=answerer, progress=progress
                        )
                        ttfts = [r.ttft_ms for r in score.results if r.ttft_ms is not None and not r.declined]
                        measured[style].append(
                            {
                                **score.breakdown(),
                                "seconds": round(time.perf_counter() - started, 1),
                                "ttft_ms_p50": round(percentile(ttfts, 50) or 0, 1),
                                "ttft_ms_p90": round(percentile(ttfts, 90) or 0, 1),
                                "tokens_per_s": round(use.tokens / use.seconds, 1) if use.seconds else None,
                                "results": [dataclasses.asdict(r) for r in score.results] if run == 1 else [],
                            }
                        )
                        row = measured[style][-1]
                        per_set = "  ".join(
                            f"{name} right {figures['answered_right']:.3f} declined "
                            f"{figures['declined_right']:.3f} invented {figures['invented']:.3f}"
                            for name, figures in row["sets"].items()
                        )
                        print(
                            f"{style:<10} run {run}: {per_set}  "
                            f"TTFT p50 {row['ttft_ms_p50']:.0f} ms  ({row['seconds']:.0f} s)",
                            flush=True,
                        )
            finally:
                if engine is not None:
                    await engine.shutdown()
            return measured

        measured = asyncio.run(ask_all())
    summary: dict[str, Any] = {}
    for style, rows in measured.items():
        sets = {
            name: {part: _spread([row["sets"][name][part] for row in rows]) for part in PARTS}
            for name in rows[0]["sets"]
        }
        summary[style] = {
            "sets": sets,
            "overall": _spread([row["overall"] for row in rows]),
            "ttft_ms_p50": _spread([row["ttft_ms_p50"] for row in rows]),
            "ttft_ms_p90": _spread([row["ttft_ms_p90"] for row in rows]),
            "tokens_per_s": _spread([row["tokens_per_s"] for row in rows])
            if rows[0]["tokens_per_s"]
            else None,
            "failed": max(row["failed"] for row in rows),
        }
    if "generated" in summary:
        base = summary["generated"]["ttft_ms_p50"]["median"]
        for row in summary.values():
            row["added_ttft_ms_p50"] = round(row["ttft_ms_p50"]["median"] - base, 1)
    return {
        "model": os.path.basename(str(settings.INFERENCE_MODEL)),
        "turns": turns,
        "conversations": len(conversations),
        "runs": runs,
        "styles": list(styles),
        "summary": summary,
        "measured": measured,
    }
