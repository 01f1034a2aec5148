"""deploy/: the Grafana dashboard, the Prometheus rules and scrape config, the nginx example."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from django.conf import settings
from prometheus_client import REGISTRY

import inference.metrics  # noqa: F401  (registers the worker's metrics, as the worker does)
from scheduler.metrics import WEB_REGISTRY

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DASHBOARD = json.loads((DEPLOY / "grafana" / "dashboard.json").read_text())
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
METRIC = re.compile(r"\bllm_[a-z0-9_]+")
SAMPLE_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}


def _panels() -> list[dict]:
    return [panel for panel in DASHBOARD["panels"] if panel["type"] != "row"]


def _dashboard_queries() -> list[str]:
    return [target["expr"] for panel in _panels() for target in panel["targets"]]


def _alert_queries() -> list[str]:
    rules = yaml.safe_load(ALERTS.read_text())
    return [rule["expr"] for group in rules["groups"] for rule in group["rules"]]


def _promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: apt-get install prometheus (.ci/run installs it)"
    return subprocess.run([promtool, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def test_the_dashboard_is_a_grafana_dashboard_on_a_chosen_prometheus():
    assert DASHBOARD["schemaVersion"] >= 39
    assert DASHBOARD["uid"] and DASHBOARD["title"]
    variables = {variable["name"]: variable for variable in DASHBOARD["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [panel["id"] for panel in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids))
    for panel in _panels():
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        position = panel["gridPos"]
        assert {"h", "w", "x", "y"} <= position.keys() and position["x"] + position["w"] <= 24, panel["title"]
        ref_ids = [target["refId"] for target in panel["targets"]]
        assert ref_ids and len(ref_ids) == len(set(ref_ids)), panel["title"]


def test_the_dashboard_shows_what_the_issue_asks_for():
    queries = "\n".join(_dashboard_queries())
    for metric in (
        "llm_queue_depth",
        "llm_admissions_total",
        "llm_time_to_first_token_seconds_bucket",
        "llm_inter_token_latency_seconds_bucket",
        "llm_output_tokens_sum",
        "llm_worker_running_sequences",
        "llm_worker_sequence_slots",
        "llm_worker_kv_cache_usage_ratio",
        "llm_worker_memory_used_bytes",
        "llm_canary_split_percent",
        "llm_canary_rollbacks_total",
    ):
        assert metric in queries
    assert "histogram_quantile(0.95" in queries and "histogram_quantile(0.5" in queries


@pytest.mark.django_db
def test_every_metric_the_dashboard_and_the_alerts_query_is_exported():
    exported = {
        family.name + suffix
        for registry in (REGISTRY, WEB_REGISTRY)
        for family in registry.collect()
        for suffix in SAMPLE_SUFFIXES.get(family.type, ())
    }
    queried = {name for query in _dashboard_queries() + _alert_queries() for name in METRIC.findall(query)}
    assert queried - exported == set()


def test_the_alerting_rules_are_valid_and_fire_as_their_unit_tests_expect():
    checked = _promtool("check", "rules", "alerts.yml", cwd=ALERTS.parent)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = _promtool("test", "rules", "alerts_test.yml", cwd=ALERTS.parent)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_the_scrape_config_is_valid(tmp_path):
    for name in ("prometheus.yml", "alerts.yml"):
        shutil.copy(DEPLOY / "prometheus" / name, tmp_path)
    (tmp_path / "llm-metrics-token").write_text("the METRICS_TOKEN\n")  # the operator's file
    checked = _promtool("check", "config", "prometheus.yml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_every_dashboard_query_is_valid_promql(tmp_path):
    # promtool has no offline query check; a recording rule per query gets the same parser.
    rules = [
        {
            "record": f"dashboard:query_{n}",
            "expr": expr.replace("$__rate_interval", "5m").replace("$variant", ".*"),
        }
        for n, expr in enumerate(_dashboard_queries())
    ]
    rules_file = tmp_path / "dashboard_rules.yml"
    rules_file.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    checked = _promtool("check", "rules", "dashboard_rules.yml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def _with_a_test_certificate(tmp_path) -> str:
    """deploy/nginx.conf with its certificate and key paths pointing at a self-signed pair."""
    certificate, key = tmp_path / "chat.crt", tmp_path / "chat.key"
    made = subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=chat.example.com", "-keyout", str(key), "-out", str(certificate)],
        capture_output=True,
        timeout=60,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    config = (DEPLOY / "nginx.conf").read_text()
    config = config.replace("/etc/nginx/tls/chat.example.com.crt", str(certificate))
    config = config.replace("/etc/nginx/tls/chat.example.com.key", str(key))
    (tmp_path / "nginx.conf").write_text(config)
    return str(tmp_path / "nginx.conf")


def test_the_nginx_example_is_valid(tmp_path):
    nginx = shutil.which("nginx")
    assert nginx, "nginx is missing: apt-get install nginx (.ci/run installs it)"
    (tmp_path / "logs").mkdir()
    checked = subprocess.run(
        [
            nginx,
            "-t",
            "-c",
            _with_a_test_certificate(tmp_path),
            "-p",
            str(tmp_path),
            "-g",
            f"pid {tmp_path}/nginx.pid; error_log {tmp_path}/error.log;",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert checked.returncode == 0, checked.stderr


def test_the_nginx_example_streams_answers_unbuffered():
    config = "\n".join(line.partition("#")[0] for line in (DEPLOY / "nginx.conf").read_text().splitlines())
    stream = config[config.index("location /chat/stream/") :]
    stream = stream[: stream.index("}")]
    assert "proxy_buffering off;" in stream
    assert "proxy_read_timeout 45s;" in stream  # three heartbeats (tests/launcher/test_nginx.py)
    assert "proxy_ignore_headers" not in config  # X-Accel-Buffering from the app is honoured


@pytest.mark.parametrize("path", ["/console/live/socket", "/console/inbox/socket"])
def test_the_nginx_example_upgrades_the_console_sockets(path):
    config = "\n".join(line.partition("#")[0] for line in (DEPLOY / "nginx.conf").read_text().splitlines())
    socket = config[config.index(f"location = {path}") :]
    socket = socket[: socket.index("}")]
    assert "proxy_set_header Upgrade $http_upgrade;" in socket
    assert 'proxy_set_header Connection "upgrade";' in socket
    assert "proxy_set_header Host $host;" in socket  # the origin check compares against it


def test_the_nginx_example_streams_hand_off_events_unbuffered():
    config = "\n".join(line.partition("#")[0] for line in (DEPLOY / "nginx.conf").read_text().splitlines())
    stream = config[config.index("location ~ ^/chat/[0-9a-f-]+/events$") :]
    stream = stream[: stream.index("}")]
    assert "proxy_buffering off;" in stream
    assert "proxy_read_timeout 45s;" in stream


@pytest.mark.security
def test_the_nginx_example_does_not_pass_the_django_admin_to_the_internet():
    config = "\n".join(line.partition("#")[0] for line in (DEPLOY / "nginx.conf").read_text().splitlines())
    admin = config[config.index("location /admin/ {") :]
    admin = admin[: admin.index("}")]
    assert "return 404;" in admin


def _nginx_example() -> str:
    return "\n".join(line.partition("#")[0] for line in (DEPLOY / "nginx.conf").read_text().splitlines())


@pytest.mark.security
def test_the_nginx_example_serves_https_and_sends_plain_http_there():
    config = _nginx_example()
    assert "listen 443 ssl;" in config
    assert "ssl_protocols TLSv1.2 TLSv1.3;" in config
    redirect = config[config.index("listen 80;") :]
    redirect = redirect[: redirect.index("}")]
    assert "return 301 https://$host$request_uri;" in redirect
    assert "proxy_pass" not in redirect


@pytest.mark.security
def test_the_nginx_example_caps_bodies_a_little_above_the_apps_own_caps_and_limits_each_address():
    config = _nginx_example()
    [size] = re.findall(r"client_max_body_size (\d+)m;", config)
    assert (
        settings.DATA_UPLOAD_MAX_MEMORY_SIZE <= int(size) * 2**20 <= 2 * settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    )
    assert "limit_conn per_address" in config
    sign_in = config[config.index("location = /accounts/login/") :]
    assert "limit_req zone=sign_in" in sign_in[: sign_in.index("}")]
