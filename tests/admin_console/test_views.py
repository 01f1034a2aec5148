"""Console pages through HTTP: who may see them, what they show, what their forms change."""

import json
from datetime import timedelta

import pytest
from django.core.checks import run_checks
from django.test import Client
from django.urls import resolve
from django.utils import timezone

from accounts.models import User
from admin_console import urls as console_urls
from admin_console.models import AuditLog, CanaryRollout
from api import keys as api_keys
from api.models import ApiKey
from knowledge.models import Article, CachedAnswer
from scheduler import fair_share
from scheduler.generation import Origin
from scheduler.models import TierPolicy, Variant
from scheduler.queues import job_enqueue
from scheduler.routing import canary_split
from tests.admin_console.conftest import heartbeat, quality_scored
from tests.generation_jobs import MODEL, generation_job, generation_record

pytestmark = pytest.mark.django_db

CONVERSATION = "6f1c2a52-93a4-4a43-9f0e-3c1d0c2b7a10"
# Every console URL with the method it answers; the first test keeps this list complete.
CONSOLE_URLS = [
    ("GET", "/console/"),
    ("GET", "/console/live"),
    ("POST", "/console/workers/worker-1/drain"),
    ("POST", "/console/workers/spares"),
    ("GET", "/console/limits"),
    ("POST", "/console/limits/fair-share"),
    ("POST", "/console/limits/normal"),
    ("GET", "/console/variants"),
    ("POST", "/console/variants/new"),
    ("POST", "/console/variants/stable"),
    ("GET", "/console/cache"),
    ("POST", "/console/cache/pin"),
    ("POST", "/console/cache/1/unpin"),
    ("GET", "/console/canary"),
    ("POST", "/console/canary/start"),
    ("POST", "/console/canary/split"),
    ("POST", "/console/canary/promote"),
    ("POST", "/console/canary/rollback"),
    ("GET", "/console/canary/quality"),
    ("POST", "/console/canary/quality/start"),
    ("GET", "/console/audit"),
    ("GET", "/console/api-keys"),
    ("POST", "/console/api-keys/create"),
    ("POST", "/console/api-keys/1/revoke"),
    ("POST", "/console/api-keys/1/limits"),
    ("GET", "/console/knowledge"),
    ("POST", "/console/knowledge/new"),
    ("POST", "/console/knowledge/1"),
    ("POST", "/console/knowledge/1/retire"),
    ("POST", "/console/knowledge/1/restore"),
    ("GET", "/console/inbox"),
    ("GET", "/console/inbox/snapshot"),
    ("POST", "/console/inbox/profile"),
    ("POST", "/console/inbox/target"),
    ("GET", f"/console/inbox/{CONVERSATION}"),
    ("POST", f"/console/inbox/{CONVERSATION}/claim"),
    ("POST", f"/console/inbox/{CONVERSATION}/reply"),
    ("POST", f"/console/inbox/{CONVERSATION}/note"),
    ("POST", f"/console/inbox/{CONVERSATION}/hand-back"),
    ("POST", f"/console/inbox/{CONVERSATION}/resolve"),
    ("GET", "/console/experiments"),
    ("POST", "/console/experiments/start"),
    ("POST", "/console/experiments/end"),
]


def _call(client: Client, method: str, url: str, **headers: str):
    return client.get(url, headers=headers) if method == "GET" else client.post(url, headers=headers)


def test_the_list_of_console_urls_covers_every_console_view():
    listed = {resolve(url).url_name for _, url in CONSOLE_URLS}
    assert listed == {pattern.name for pattern in console_urls.urlpatterns}


@pytest.mark.parametrize(("method", "url"), CONSOLE_URLS)
def test_signed_in_customers_are_refused_everywhere(method, url):
    client = Client()
    client.force_login(User.objects.create_user("alice", password="pw"))
    for headers in ({}, {"HX-Request": "true"}):
        response = _call(client, method, url, **headers)
        assert response.status_code == 403
        assert b"Staff only" in response.content


@pytest.mark.parametrize(("method", "url"), CONSOLE_URLS)
def test_visitors_who_are_not_signed_in_sign_in_for_a_page_and_are_refused_anything_else(method, url):
    client = Client()
    response = _call(client, method, url)
    if method == "GET":
        assert response.status_code == 302
        assert response["Location"] == f"/accounts/login/?next={url}"
    else:
        assert response.status_code == 403
    # An htmx request cannot come back after signing in either.
    assert _call(client, method, url, **{"HX-Request": "true"}).status_code == 403


def test_a_customer_changes_nothing():
    client = Client()
    client.force_login(User.objects.create_user("alice", password="pw"))
    before = TierPolicy.objects.get(tier="normal").bucket_capacity
    client.post("/console/limits/normal", {"normal-bucket_capacity": before + 1})
    client.post("/console/canary/split", {"split_percent": 100})
    assert TierPolicy.objects.get(tier="normal").bucket_capacity == before
    assert canary_split().split_percent == 0
    assert not AuditLog.objects.exists()


def test_the_dashboard_shows_queues_and_workers(client_staff):
    worker_id = heartbeat("stable")
    for n in range(3):
        job_enqueue(
            tier="normal",
            job=generation_job(f"r{n}"),
            max_queued=10,
            wait_slo_s=100,
            max_wait_s=60,
        )
    page = client_staff.get("/console/")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="queue-depth-total" data-value="3"' in html
    assert worker_id in html
    assert "engine process, no GPU" in html
    assert "75.0%" in html  # of the prompt tokens looked up, those in the prefix cache
    assert 'hx-trigger="console-poll"' in html  # the fallback poll, triggered by console.js


def test_the_dashboard_shows_a_workers_paused_answers_and_its_vip_job_waiting_for_a_slot(client_staff):
    heartbeat("stable")
    busy = heartbeat("candidate", paused=2, vip_waiting=True)
    html = client_staff.get("/console/").content.decode()
    row = html.split(busy)[1].split("</tr>")[0]
    assert "2 paused" in row and "VIP waiting for a slot" in row
    assert html.count("VIP waiting for a slot") == 1  # the other worker holds none


def test_the_dashboard_shows_the_workers_wanted_beside_the_live_ones(client_staff, settings):
    settings.SERVICE_TIME_PRIOR_S = 60.0  # 6 slots below VIP, 60 s an answer: 0.1 normal job/s
    heartbeat("stable")
    for n in range(30):
        job_enqueue(
            tier="normal",
            job=generation_job(f"r{n}"),
            max_queued=100,
            wait_slo_s=10**6,
            max_wait_s=60,
        )
    html = client_staff.get("/console/").content.decode()
    assert f'data-model="{MODEL}" data-live="1"' in html
    desired = int(html.split(f'data-model="{MODEL}" data-live="1" data-desired="')[1].split('"')[0])
    assert desired > 1
    assert f"{MODEL}: 1 live, <span" in html and f"{desired} desired</span>" in html


def test_the_live_partial_swaps_the_tables_and_chart_data_out_of_band(client_staff):
    response = client_staff.get("/console/live", HTTP_HX_REQUEST="true")
    html = response.content.decode()
    assert 'id="live-summary"' in html
    assert 'id="live-tables" class="live-tables" hx-swap-oob="true"' in html
    charts = json.loads(
        html.split('<script id="chart-data" type="application/json">')[1].split("</script>")[0]
    )
    assert len(charts["starts"]) == 90
    assert set(charts["queue_depth"]) == {"vip", "normal", "batch"}


def test_a_valid_policy_edit_is_saved_and_an_invalid_one_shows_why(client_staff):
    values = {
        f"vip-{name}": value
        for name, value in TierPolicy.objects.filter(tier="vip").values().get().items()
        if name not in {"tier", "updated_at"}
    }
    saved = client_staff.post("/console/limits/vip", {**values, "vip-max_queued": 33})
    assert saved.status_code == 302
    assert TierPolicy.objects.get(tier="vip").max_queued == 33
    refused = client_staff.post("/console/limits/vip", {**values, "vip-max_queued": 0})
    assert refused.status_code == 400
    assert b"Ensure this value is greater than or equal to 1." in refused.content
    assert TierPolicy.objects.get(tier="vip").max_queued == 33
    assert AuditLog.objects.count() == 1


def test_staff_set_the_fair_share_weights_and_admission_applies_them(client_staff):
    page = client_staff.get("/console/limits")
    assert b"Fair share inside a tier" in page.content
    weights = {"chat": "2", "api": "0.5", "batch": "1", "quality": "1"}
    saved = client_staff.post("/console/limits/fair-share", weights)
    assert saved.status_code == 302
    assert fair_share.kind_weights()["chat"] == 2.0
    share = fair_share.job_fair_share(generation_job(origin=Origin.API, client_id="key:9"))
    assert (share.source, share.weight) == ("api:key:9", 0.5)
    refused = client_staff.post("/console/limits/fair-share", weights | {"api": "0"})
    assert refused.status_code == 400
    assert fair_share.kind_weights()["api"] == 0.5
    assert AuditLog.objects.filter(target="fair share").count() == 1


def test_staff_edit_and_add_variants_and_each_change_is_audited(client_staff):
    page = client_staff.get("/console/variants")
    assert page.status_code == 200
    assert b"Save stable" in page.content and b"Save candidate" in page.content
    values = {
        f"candidate-{name}": value
        for name, value in Variant.objects.filter(name="candidate").values().get().items()
        if name not in {"id", "name", "updated_at", "knowledge"}
    }
    saved = client_staff.post("/console/variants/candidate", {**values, "candidate-temperature": 0.1})
    assert saved.status_code == 302
    candidate = Variant.objects.get(name="candidate")
    assert (candidate.temperature, candidate.knowledge) == (0.1, False)  # an unticked box is off
    entry = AuditLog.objects.get(action="variant.update")
    assert (entry.target, entry.before["temperature"], entry.after["temperature"]) == ("candidate", 0.3, 0.1)
    refused = client_staff.post("/console/variants/candidate", {**values, "candidate-temperature": 3})
    assert refused.status_code == 400
    assert b"less than or equal to 2.0" in refused.content

    new = {f"new-{name.removeprefix('candidate-')}": value for name, value in values.items()}
    added = client_staff.post("/console/variants/new", {**new, "new-name": "terse", "new-knowledge": "on"})
    assert added.status_code == 302
    assert Variant.objects.get(name="terse").knowledge
    assert AuditLog.objects.filter(action="variant.create", target="terse").exists()
    taken = client_staff.post("/console/variants/new", {**new, "new-name": "terse"})
    assert taken.status_code == 400
    assert b"already exists" in taken.content


def test_staff_name_a_variant_s_tool_call_parser_for_auto_tool_choice(client_staff):
    assert b"Tool-call parser" in client_staff.get("/console/variants").content
    values = {
        f"stable-{name}": value
        for name, value in Variant.objects.filter(name="stable").values().get().items()
        if name not in {"id", "name", "updated_at", "knowledge"}
    }
    saved = client_staff.post("/console/variants/stable", {**values, "stable-tool_call_parser": "pythonic"})
    assert saved.status_code == 302
    assert Variant.objects.get(name="stable").tool_call_parser == "pythonic"
    entry = AuditLog.objects.get(action="variant.update", target="stable")
    assert (entry.before["tool_call_parser"], entry.after["tool_call_parser"]) == ("", "pythonic")


def test_each_variant_shows_what_its_answers_of_the_last_hour_were_checked_for(client_staff):
    verified = {"style": "verified", "checked": 3, "replaced": 1, "dropped": 0, "declined": ""}
    generation_record(variant="candidate", grounding=verified)
    generation_record(variant="candidate", grounding={**verified, "replaced": 0, "checked": 2})
    generation_record(
        variant="candidate", grounding={**verified, "checked": 0, "replaced": 0, "declined": "far"}
    )
    generation_record(
        variant="candidate", grounding=verified, finished_at=timezone.now() - timedelta(hours=2)
    )
    Variant.objects.filter(name="candidate").update(answer_style="verified")
    page = client_staff.get("/console/variants").content.decode()
    line = page.split('data-grounding="candidate"')[1].split("</p>")[0]
    assert "<strong>3</strong>, 1 declined (33 %)" in line
    assert "5 sentences checked, 1 replaced by the help center's own and 0 left out, in 1 answers" in line
    assert "none" in page.split('data-grounding="stable"')[1].split("</p>")[0]


def test_each_variant_shows_its_latest_quality_score_and_whether_it_predates_an_edit(client_staff):
    quality_scored("stable", 0.512)
    quality_scored("candidate", 0.4)
    quality_scored("candidate", 0.634)
    Variant.objects.get(name="candidate").save()  # edited after its score

    page = client_staff.get("/console/variants").content.decode()

    def note(variant: str) -> str:
        return page.split(f'data-quality="{variant}"')[1].split("</p>")[0]

    assert "<strong>0.512</strong>" in note("stable") and "before the last change" not in note("stable")
    assert "<strong>0.634</strong>" in note("candidate") and "before the last change" in note("candidate")
    Variant.objects.create(name="terse", model=MODEL, system_prompt="-", temperature=0, top_p=1, max_tokens=8)
    assert (
        "none yet" in client_staff.get("/console/variants").content.decode().split('data-quality="terse"')[1]
    )


def test_a_policy_that_cannot_work_is_refused_in_the_words_of_manage_py_check(client_staff, settings):
    values = {
        f"vip-{name}": value
        for name, value in TierPolicy.objects.filter(tier="vip").values().get().items()
        if name not in {"tier", "updated_at"}
    }
    refused = client_staff.post("/console/limits/vip", {**values, "vip-wait_slo_s": 60, "vip-max_wait_s": 30})
    assert refused.status_code == 400
    assert TierPolicy.objects.get(tier="vip").wait_slo_s == values["vip-wait_slo_s"]
    settings.RATE_LIMIT_POLICIES = {
        **settings.RATE_LIMIT_POLICIES,
        "vip": {**settings.RATE_LIMIT_POLICIES["vip"], "wait_slo_s": 60.0, "max_wait_s": 30.0},
    }
    [check] = [message for message in run_checks() if message.id == "scheduler.E101"]
    assert f"{check.msg} {check.hint}".encode() in refused.content


def test_a_drain_button_asks_the_worker_to_drain(client_staff):
    worker_id = heartbeat("stable")
    response = client_staff.post(f"/console/workers/{worker_id}/drain", follow=True)
    assert b"is draining" in response.content
    assert AuditLog.objects.get().action == "worker.drain"


def test_the_dashboard_shows_spares_and_sets_their_number(client_staff):
    heartbeat("stable")
    spare = heartbeat("stable", spare=True)
    page = client_staff.get("/console/").content.decode()
    assert page.count("warm spare</span>") == 1
    assert page.index(spare) < page.index("warm spare</span>")
    assert 'data-spares="0"' in page
    response = client_staff.post("/console/workers/spares", {"spares": "2"}, follow=True)
    assert b"keeps 2 warm spares" in response.content
    assert b'data-spares="2"' in response.content
    assert AuditLog.objects.get().action == "worker.spares"
    refused = client_staff.post("/console/workers/spares", {"spares": "-1"}, follow=True)
    assert b"a whole number from 0 to 16" in refused.content
    assert b'data-spares="2"' in refused.content


def test_the_canary_page_starts_moves_and_rolls_back_a_canary(client_staff):
    heartbeat("stable")
    heartbeat("candidate")
    page = client_staff.get("/console/canary")
    assert b'<option value="candidate">candidate</option>' in page.content
    form = {
        "candidate_variant": "candidate",
        "step_percents": "5 → 20 → 50 → 100",
        "hold_seconds": "60",
        "max_error_rate_increase_points": 5,
        "max_ttft_p95_ratio": 1.5,
        "max_thumbs_down_increase_points": 10,
        "min_answers": 20,
        "min_votes": 10,
        "window_s": 300,
    }
    assert client_staff.post("/console/canary/start", form).status_code == 302
    assert CanaryRollout.objects.get().steps[1] == {"percent": 20, "hold_s": 60}
    assert canary_split().split_percent == 5
    assert client_staff.post("/console/canary/split", {"split_percent": 70}).status_code == 302
    assert canary_split().split_percent == 70
    page = client_staff.get("/console/canary").content.decode()
    assert 'data-split="70"' in page
    assert client_staff.post("/console/canary/rollback").status_code == 302
    assert canary_split().split_percent == 0
    page = client_staff.get("/console/canary").content.decode()
    assert "rolled back" in page
    assert 'id="rollback-banner"' not in page  # only automatic rollbacks raise the banner


@pytest.mark.parametrize(
    ("steps", "holds", "error"),
    [
        ("5, 20, 50", "60", "The last step must send 100%"),
        ("5, twenty, 100", "60", "whole numbers"),
        ("5, 50, 100", "60, 60", "one hold for every step"),
    ],
)
def test_a_bad_plan_is_refused_with_a_reason(client_staff, steps, holds, error):
    heartbeat("candidate")
    form = {"candidate_variant": "candidate", "step_percents": steps, "hold_seconds": holds}
    form |= {
        "max_error_rate_increase_points": 5,
        "max_ttft_p95_ratio": 1.5,
        "max_thumbs_down_increase_points": 10,
    }
    form |= {"min_answers": 20, "min_votes": 10, "window_s": 300}
    response = client_staff.post("/console/canary/start", form)
    assert response.status_code == 400
    assert error in response.content.decode()
    assert not CanaryRollout.objects.exists()


def test_an_automatic_rollback_raises_a_banner_on_every_console_page(client_staff, staff):
    heartbeat("candidate")
    CanaryRollout.objects.create(
        stable_variant="stable",
        candidate_variant="candidate",
        steps=[{"percent": 100, "hold_s": 0}],
        step_started_at="2026-01-01T00:00:00Z",
        status="rolled_back",
        automatic=True,
        rollback_reason="error_rate, ttft_p95",
        ended_at="2026-01-01T00:05:00Z",
    )
    for url in ("/console/", "/console/limits"):
        html = client_staff.get(url).content.decode()
        assert 'id="rollback-banner"' in html
        assert "broke the error-rate and TTFT p95 rules" in html


def test_the_audit_log_lists_changes_newest_first(client_staff, staff):
    AuditLog.objects.create(
        actor=staff,
        actor_name="sam",
        action="policy.update",
        target="vip",
        before={"max_queued": 200},
        after={"max_queued": 33},
    )
    html = client_staff.get("/console/audit").content.decode()
    assert "Rate-limit policy changed" in html
    assert "<del>200</del> → <ins>33</ins>" in html


def test_staff_write_edit_and_retire_help_articles_and_each_change_is_audited(client_staff, staff):
    assert client_staff.get("/console/knowledge/new").status_code == 200
    response = client_staff.post(
        "/console/knowledge/new",
        {"title": "Pets", "slug": "pets", "body": "Dogs on a lead are welcome in our stores."},
    )
    assert response.status_code == 302
    article = Article.objects.get(slug="pets")
    listing = client_staff.get("/console/knowledge").content.decode()
    assert "Pets" in listing and 'href="/help/pets"' in listing

    response = client_staff.post(
        f"/console/knowledge/{article.pk}",
        {"title": "Pets", "slug": "pets", "body": "Only guide dogs, please."},
    )
    assert response.status_code == 302
    assert Client().get("/help/pets").content.decode().count("Only guide dogs") == 1

    assert client_staff.post(f"/console/knowledge/{article.pk}/retire").status_code == 302
    assert Client().get("/help/pets").status_code == 404
    assert client_staff.post(f"/console/knowledge/{article.pk}/restore").status_code == 302

    entries = AuditLog.objects.filter(target="pets").order_by("id")
    assert [(entry.action, entry.actor_name) for entry in entries] == [
        ("article.create", "sam"),
        ("article.update", "sam"),
        ("article.retire", "sam"),
        ("article.restore", "sam"),
    ]
    assert ("status", "active", "retired") in entries[2].changes()


def test_an_article_with_a_slug_in_use_or_no_text_is_refused_with_a_reason(client_staff):
    client_staff.post("/console/knowledge/new", {"title": "Pets", "slug": "pets", "body": "Dogs welcome."})
    response = client_staff.post("/console/knowledge/new", {"title": "Pets 2", "slug": "pets", "body": "x"})
    assert response.status_code == 400
    assert "already exists" in response.content.decode()
    response = client_staff.post("/console/knowledge/new", {"title": "Empty", "slug": "empty", "body": ""})
    assert response.status_code == 400
    assert Article.objects.count() == 1
    assert AuditLog.objects.filter(action="article.create").count() == 1


def test_the_cache_page_shows_the_figures_and_pinned_answers_are_removed_with_an_audit(client_staff):
    page = client_staff.get("/console/cache")
    assert page.status_code == 200 and b"Engine time saved" in page.content
    refused = client_staff.post(
        "/console/cache/pin", {"variant": "stable", "question": "Where is order 55123?", "answer": "Here."}
    )
    assert refused.status_code == 400
    assert b"never serves personal data" in refused.content
    pinned = client_staff.post(
        "/console/cache/pin",
        {"variant": "stable", "question": "Do you ship abroad?", "answer": "Yes, to the EU."},
    )
    assert pinned.status_code == 302
    (entry,) = CachedAnswer.objects.all()
    assert client_staff.post(f"/console/cache/{entry.pk}/unpin").status_code == 302
    assert not CachedAnswer.objects.exists()
    assert list(AuditLog.objects.values_list("action", flat=True)) == ["answer.unpin", "answer.pin"]


def test_staff_set_a_key_s_limits_audited_and_applied_to_its_next_call(client_staff):
    issued = api_keys.api_key_create(owner=User.objects.create(username="alice"))
    key = issued.api_key
    response = client_staff.post(
        f"/console/api-keys/{key.pk}/limits",
        {
            f"key-{key.pk}-requests_per_minute": "2",
            f"key-{key.pk}-tokens_per_minute": "",
            f"key-{key.pk}-fair_share_weight": "4",
        },
        headers={"HX-Request": "true"},
    )
    assert response.status_code == 200
    assert "Limits of" in response.content.decode()
    key.refresh_from_db()
    assert (key.requests_per_minute, key.tokens_per_minute, key.fair_share_weight) == (2, None, 4.0)
    entry = AuditLog.objects.get(action="api_key.limits")
    assert (entry.actor_name, entry.target) == ("sam", key.prefix)
    assert entry.before == {"requests_per_minute": None, "tokens_per_minute": None, "fair_share_weight": None}
    assert entry.after == {"requests_per_minute": 2, "tokens_per_minute": None, "fair_share_weight": 4.0}
    auth = {"Authorization": f"Bearer {issued.plaintext}"}
    assert Client().get("/v1/models", headers=auth)["x-ratelimit-limit-requests"] == "2"

    refused = client_staff.post(
        f"/console/api-keys/{key.pk}/limits",
        {f"key-{key.pk}-requests_per_minute": "0"},
        headers={"HX-Request": "true"},
    )
    assert refused.status_code == 400
    assert ApiKey.objects.get(pk=key.pk).requests_per_minute == 2
    assert AuditLog.objects.filter(action="api_key.limits").count() == 1
