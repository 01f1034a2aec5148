"""Django settings. Every environment read goes through config.env; defaults run the demo."""

from pathlib import Path
from urllib.parse import unquote, urlparse

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from config.env import env_bool, env_float, env_int, env_list, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = BASE_DIR / "var"

DEBUG = env_bool("DJANGO_DEBUG", False)
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", [])


def _secret_key() -> str:
    """DJANGO_SECRET_KEY, else the key in DJANGO_SECRET_KEY_FILE (`make run` writes a random one
    to var/secret_key once). A key everyone can read in this repository would let anyone forge
    sessions, so only a DEBUG run may fall back to one."""
    key = env_str("DJANGO_SECRET_KEY", "")
    key_file = Path(env_str("DJANGO_SECRET_KEY_FILE", str(VAR_DIR / "secret_key")))
    if not key and key_file.is_file():
        key = key_file.read_text().strip()
    if key:
        return key
    if DEBUG:
        return "insecure-key-for-debug-runs-only"
    raise ImproperlyConfigured(
        "No secret key: set DJANGO_SECRET_KEY to a long random value (for example the output of "
        "`python -c 'import secrets; print(secrets.token_urlsafe(50))'`), or put one in the file "
        f"named by DJANGO_SECRET_KEY_FILE ({key_file})."
    )


SECRET_KEY = _secret_key()

# HTTPS, for a deployment behind a TLS-terminating proxy (README: "Running in production").
_secure_cookies = env_bool("DJANGO_SECURE_COOKIES", False)
SESSION_COOKIE_SECURE = _secure_cookies
CSRF_COOKIE_SECURE = _secure_cookies
SECURE_HSTS_SECONDS = env_int("DJANGO_HSTS_SECONDS", 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("DJANGO_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("DJANGO_HSTS_PRELOAD", False)
SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", False)
# Probes and scrapers reach a web process directly over plain HTTP, not through the proxy.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]
# The header the proxy sets to the scheme the client used, e.g. X-Forwarded-Proto.
_proxy_ssl_header = env_str("DJANGO_SECURE_PROXY_SSL_HEADER", "")
SECURE_PROXY_SSL_HEADER = (
    ("HTTP_" + _proxy_ssl_header.upper().replace("-", "_"), "https") if _proxy_ssl_header else None
)

# Sent with every response (config.middleware.ContentSecurityPolicyMiddleware): scripts only from
# this site's files (no inline script, no event handler attribute, no eval), so markup that got
# into a page could not run. Styles may be inline (a bar's width, an icon's rotation).
CONTENT_SECURITY_POLICY = env_str(
    "CONTENT_SECURITY_POLICY",
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'self'; form-action 'self'; frame-ancestors 'none'",
)

INSTALLED_APPS = [
    # inference comes before channels so its `runworker` extends Channels' command.
    "inference",
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "django_htmx",
    "accounts",
    "chat",
    "api",
    "scheduler",
    "admin_console",
    "knowledge",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "config.middleware.ContentSecurityPolicyMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "chat.guests.GuestEndMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "config.middleware.DatabaseBusyMiddleware",
]

ROOT_URLCONF = "config.urls"
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# SQLite: each thread keeps its connection (CONN_MAX_AGE None). Opening one (the WAL pragmas,
# Django's SQL functions) cost a chat post about a millisecond, and every thread that reaches the
# database is long-lived and bounded: a web process's sync-view turns and async-view threads
# (config.middleware.SyncViewGate), the answer streams' executor, the worker's one thread.
# PostgreSQL gets a pool per process instead (it refuses persistent connections beside one):
# connections are reused across threads, and a burst waits for one rather than exceeding the
# server's max_connections.
DATABASES = {"default": dj_database_url.parse(env_str("DATABASE_URL", f"sqlite:///{VAR_DIR / 'db.sqlite3'}"))}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # WAL lets the web, worker and Celery processes read while one of them writes.
    DATABASES["default"]["OPTIONS"] = {
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
    }
    DATABASES["default"]["CONN_MAX_AGE"] = None
elif DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": 1,
        "max_size": env_int("DATABASE_POOL_SIZE", 20),
        "timeout": env_float("DATABASE_POOL_TIMEOUT_S", 10.0),
    }
# Sync views a web process runs at once (config.middleware.SyncViewGate), and how long a
# request waits for its turn before a 503. As many as the pool has connections: each can have one.
WEB_SYNC_VIEWS_MAX = env_int("WEB_SYNC_VIEWS_MAX", env_int("DATABASE_POOL_SIZE", 20))
WEB_SYNC_VIEW_WAIT_S = env_float("WEB_SYNC_VIEW_WAIT_S", 10.0)

# Its table is `chat_user`, the name it had in the chat app (accounts/models.py).
AUTH_USER_MODEL = "accounts.User"
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "chat:home"
LOGOUT_REDIRECT_URL = "chat:home"
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# Failed sign-ins allowed per username and per address (IPv6: per /64) in a window that starts
# at the first failure; more are refused with 429 until the window ends.
LOGIN_MAX_FAILURES_PER_USERNAME = env_int("LOGIN_MAX_FAILURES_PER_USERNAME", 5)
LOGIN_MAX_FAILURES_PER_ADDRESS = env_int("LOGIN_MAX_FAILURES_PER_ADDRESS", 20)
LOGIN_FAILURE_WINDOW_S = env_int("LOGIN_FAILURE_WINDOW_S", 900)
SESSION_COOKIE_AGE = 60 * 60 * 24 * 30
SESSION_COOKIE_HTTPONLY = True

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# `manage.py test` runs the suite with pytest, as `make test` does (labels and tags become its own).
TEST_RUNNER = "tests.runner.PytestRunner"

REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/0")
# Connections per pool (each process has a sync pool and one async pool per event loop).
REDIS_MAX_CONNECTIONS = env_int("REDIS_MAX_CONNECTIONS", 64)
# With Sentinels (host:port, comma-separated), every Redis client (ours, the channel layer,
# Celery) asks them for the current primary of REDIS_SENTINEL_MASTER and follows a failover;
# REDIS_URL then gives only the database number and the login: a password
# (redis://:password@host/0) or an account with its password (redis://user:password@host/0).
REDIS_SENTINELS = [
    (host, int(port))
    for host, _, port in (entry.rpartition(":") for entry in env_list("REDIS_SENTINELS", []))
]
REDIS_SENTINEL_MASTER = env_str("REDIS_SENTINEL_MASTER", "support-chat")
_redis_url = urlparse(REDIS_URL)
REDIS_DB = int(_redis_url.path.strip("/") or 0)
REDIS_LOGIN = {
    name: unquote(value)
    for name, value in (("username", _redis_url.username), ("password", _redis_url.password))
    if value
}
# The Sentinels' own password (their `requirepass`), when they have one. Sentinels answer at
# once or are down: a short timeout moves on to the next.
REDIS_SENTINEL_PASSWORD = env_str("REDIS_SENTINEL_PASSWORD", "")
REDIS_SENTINEL_KWARGS: dict[str, object] = {"socket_timeout": 1, "socket_connect_timeout": 1}
if REDIS_SENTINEL_PASSWORD:
    REDIS_SENTINEL_KWARGS["password"] = REDIS_SENTINEL_PASSWORD
# An accepted request has reached this many replicas (Redis WAIT) before its 202: a failover
# then loses no accepted request. A submission the replicas do not confirm within the timeout
# is withdrawn and refused with 503. 0: no wait (a single Redis, or losing a second's work is fine).
REDIS_WAIT_REPLICAS = env_int("REDIS_WAIT_REPLICAS", 0)
REDIS_WAIT_TIMEOUT_S = env_float("REDIS_WAIT_TIMEOUT_S", 1.0)

if REDIS_SENTINELS:
    _channel_host: dict | str = {
        "sentinels": REDIS_SENTINELS,
        "master_name": REDIS_SENTINEL_MASTER,
        "db": REDIS_DB,
        "sentinel_kwargs": REDIS_SENTINEL_KWARGS,
        **REDIS_LOGIN,
    }
else:
    _channel_host = REDIS_URL
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {"hosts": [_channel_host], "prefix": "llm:channels:"},
    }
}

CELERY_BROKER_URL = REDIS_URL
# Without a socket timeout a read from a Redis that stopped answering (not closed: paused,
# overloaded, behind a dead network path) waits for ever, and so does a warm shutdown.
CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {"socket_timeout": 2.0, "socket_connect_timeout": 2.0}
if REDIS_SENTINELS:
    # kombu's Sentinel transport: one URL per Sentinel, each with the primary's login (kombu
    # logs in to the primary with it), the primary's name and the Sentinels' login in the options.
    _login = f"{_redis_url.username or ''}:{_redis_url.password}@" if _redis_url.password else ""
    CELERY_BROKER_URL = ";".join(
        f"sentinel://{_login}{host}:{port}/{REDIS_DB}" for host, port in REDIS_SENTINELS
    )
    CELERY_BROKER_TRANSPORT_OPTIONS["master_name"] = REDIS_SENTINEL_MASTER
    CELERY_BROKER_TRANSPORT_OPTIONS["sentinel_kwargs"] = REDIS_SENTINEL_KWARGS
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
# No results, so none to expire: without this, beat adds a daily `celery.backend_cleanup` on a
# crontab schedule, which config.beat cannot send once a period.
CELERY_RESULT_EXPIRES = None
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
# Batch job slices run for a minute each on their own queue and worker (`celery worker -Q
# batch-jobs`): however many jobs there are, the periodic tasks on the default queue (canary
# rollback, reclaim, retention) never wait behind them.
BATCH_JOBS_CELERY_QUEUE = "batch-jobs"
CELERY_TASK_ROUTES = {
    "api.tasks.job_run": {"queue": BATCH_JOBS_CELERY_QUEUE},
    # Minutes of questions: kept off the default queue like a job's slices.
    "admin_console.tasks.quality_run": {"queue": BATCH_JOBS_CELERY_QUEUE},
}
# Every Celery host may run beat: each periodic task is still sent once per period.
CELERY_BEAT_SCHEDULER = "config.beat:OncePerPeriodScheduler"

# --- chat -------------------------------------------------------------------------------
CHAT_MAX_MESSAGE_CHARS = env_int("CHAT_MAX_MESSAGE_CHARS", 4000)
CHAT_HISTORY_MESSAGES = env_int("CHAT_HISTORY_MESSAGES", 12)
# About 500 tokens of earlier messages: with a full-length new message and the answer, the
# prompt still fits SmolLM2's 2,048-token context.
CHAT_HISTORY_MAX_CHARS = env_int("CHAT_HISTORY_MAX_CHARS", 2000)
# The system prompt and temperature that scored best on the quality questions
# (`python -m bench quality --sweep`, docs/BENCHMARKS.md section 10).
CHAT_SYSTEM_PROMPT = env_str(
    "CHAT_SYSTEM_PROMPT",
    "You are a customer-service assistant. Reply in the same language as the customer, briefly and exactly.",
)
# How the `stable` variant answers when the database is created (later, the console edits it):
# `extractive` (the help center's own sentences, no model), `verified` (a model's answer,
# checked sentence by sentence) or `generated` (a model's answer, unchecked). Chosen by the
# quality score (docs/BENCHMARKS.md, "Grounded answers").
CHAT_ANSWER_STYLE = env_str("CHAT_ANSWER_STYLE", "extractive")

# --- hand-off to a person (chat.handoff) -----------------------------------------------------
# An agent whose inbox tab has not beaten for this long is away (tabs beat every
# HANDOFF_PRESENCE_BEAT_S; a closed tab leaves at once, a crashed one within this).
HANDOFF_PRESENCE_BEAT_S = env_float("HANDOFF_PRESENCE_BEAT_S", 15.0)
HANDOFF_PRESENCE_TTL_S = env_float("HANDOFF_PRESENCE_TTL_S", 45.0)
# A conversation's event stream: entries kept, and how long it lives after its last event (the
# database is the record: a page older than this reads it again).
HANDOFF_EVENTS_MAX = env_int("HANDOFF_EVENTS_MAX", 1000)
HANDOFF_EVENTS_TTL_S = env_int("HANDOFF_EVENTS_TTL_S", 86400)
# A conversation is resolved by the assistant when, this long after its last message, it had no
# hand-off, no thumbs-down and its customer started no new conversation.
ASSISTANT_RESOLVED_WINDOW_S = env_float("ASSISTANT_RESOLVED_WINDOW_S", 86400.0)
# The span the hand-off measures (console, /metrics) are computed over.
HANDOFF_MEASURES_WINDOW_S = env_float("HANDOFF_MEASURES_WINDOW_S", 7 * 86400.0)

# --- knowledge (the help center the answers come from) ----------------------------------
# Help-center text embedded before, kept on disk by model and text (knowledge.embedding): a new
# database, another process or an article imported again embeds only what it has not seen.
# Empty: none kept (every import embeds everything again).
EMBEDDING_STORE_PATH = env_str("EMBEDDING_STORE_PATH", str(VAR_DIR / "embeddings.sqlite3"))
# Cosine similarity (multilingual e5) a passage needs to count as relevant to a question: the
# floor of a model's excerpts, and what an article edit checks cached answers against. e5
# scores a question against an unrelated shop passage about 0.78-0.80, a related one 0.83-0.90.
KNOWLEDGE_MIN_SCORE = env_float("KNOWLEDGE_MIN_SCORE", 0.83)
KNOWLEDGE_MAX_EXCERPTS = env_int("KNOWLEDGE_MAX_EXCERPTS", 3)
# Excerpts take their room from CHAT_HISTORY_MAX_CHARS, so the prompt's size stays the same: the
# history keeps the rest whatever a question's excerpts take (knowledge.history).
KNOWLEDGE_PROMPT_MAX_CHARS = env_int("KNOWLEDGE_PROMPT_MAX_CHARS", 1200)
GUEST_RETENTION_DAYS = env_int("GUEST_RETENTION_DAYS", 30)
# The result cache (knowledge/cache.py): first-turn questions answered again from an earlier
# good answer of a model, without a GPU slot. A paraphrase matches at this cosine similarity or
# more: multilingual e5 scores near-misses (refund vs return policy, cancel vs change an order)
# up to 0.963 and close paraphrases from 0.898, so only very close wordings match
# (docs/BENCHMARKS.md, "Result cache").
ANSWER_CACHE_ENABLED = env_bool("ANSWER_CACHE_ENABLED", True)
ANSWER_CACHE_MIN_SIMILARITY = env_float("ANSWER_CACHE_MIN_SIMILARITY", 0.97)
# A generated answer answers only the very same question until this many distinct customers
# (the one it was written for included) were given it without rating it down; then it answers
# paraphrases too. One: the first answer to a question answers its paraphrases at once, as a
# crafted question ("... answer: yes") could then plant an answer for everyone.
ANSWER_CACHE_SHARE_AFTER = env_int("ANSWER_CACHE_SHARE_AFTER", 3)

# --- generation and streaming -------------------------------------------------------------
GENERATION_MAX_TOKENS = env_int("GENERATION_MAX_TOKENS", 256)
GENERATION_TEMPERATURE = env_float("GENERATION_TEMPERATURE", 0.0)
GENERATION_TOP_P = env_float("GENERATION_TOP_P", 0.95)
# The shipped variants' frequency penalty (0: none), chosen by the quality score.
GENERATION_FREQUENCY_PENALTY = env_float("GENERATION_FREQUENCY_PENALTY", 1.0)
GENERATION_TIMEOUT_S = env_float("GENERATION_TIMEOUT_S", 120.0)
# A quiet stream sends a heartbeat this often; the proxy ends a stream silent for three of them
# (deploy/nginx.conf: 45 s), as one whose web host vanished.
SSE_HEARTBEAT_S = env_float("SSE_HEARTBEAT_S", 15.0)
SSE_STATUS_INTERVAL_S = env_float("SSE_STATUS_INTERVAL_S", 2.0)
RESULT_TTL_S = env_int("RESULT_TTL_S", 3600)
# The read timeout of the proxy in front of the web processes (deploy/nginx.conf: 10 min for
# /v1/); 0 when nothing sits in front. Streams stay open by sending heartbeats more often; a
# non-streamed API answer must arrive within it.
PROXY_READ_TIMEOUT_S = env_float("PROXY_READ_TIMEOUT_S", 600.0)
# The proxy's read timeout for the chat's answer streams (deploy/nginx.conf: three default
# heartbeats, 45 s); 0 when nothing sits in front. Heartbeats must come more often.
PROXY_STREAM_READ_TIMEOUT_S = env_float("PROXY_STREAM_READ_TIMEOUT_S", 45.0)

# --- OpenAI-compatible API and batch jobs ----------------------------------------------------
# An API call whose client went away is cancelled after this long (0: at once). Unlike a
# browser, code that dropped a connection does not come back to the same stream.
API_DISCONNECT_GRACE_S = env_float("API_DISCONNECT_GRACE_S", 30.0)
# Caps on what one call may send: the body (a job's too), the messages of one chat request and
# their characters. Beyond these, a prompt must still fit the model's context with its answer.
API_MAX_BODY_BYTES = env_int("API_MAX_BODY_BYTES", 2 * 1024 * 1024)
API_MAX_MESSAGES = env_int("API_MAX_MESSAGES", 128)
API_MAX_PROMPT_CHARS = env_int("API_MAX_PROMPT_CHARS", 32000)
# Choices one call may ask for (`n`): each is a generation of its own, admitted and queued.
API_MAX_N = env_int("API_MAX_N", 8)
# A structured output constraint (a JSON schema, a regex, a grammar, choices) is compiled on the
# shared worker: at most this many characters (JSON nesting and counted repetitions are capped
# too, api/openai_requests.py).
API_MAX_STRUCTURED_CHARS = env_int("API_MAX_STRUCTURED_CHARS", 16384)
# Django refuses a body above this before any view sees it: never below the API's own cap.
DATA_UPLOAD_MAX_MEMORY_SIZE = max(API_MAX_BODY_BYTES, 2_621_440)
BATCH_JOB_MAX_REQUESTS = env_int("BATCH_JOB_MAX_REQUESTS", 1000)
# Unfinished jobs one account may have; more are refused with 429.
BATCH_JOB_MAX_ACTIVE_PER_OWNER = env_int("BATCH_JOB_MAX_ACTIVE_PER_OWNER", 4)
# Requests of one job in the scheduler at once: bounds what a job draws from the global rate
# limit and the batch queue, so that jobs interleave and a cancel has little to recall.
BATCH_JOB_MAX_IN_FLIGHT = env_int("BATCH_JOB_MAX_IN_FLIGHT", 16)
# A Celery task feeds a job for one slice, then hands it to a fresh task; a task that dies
# holds its job until the lease runs out, and the sweep (every BATCH_JOB_RESUME_S) restarts it.
BATCH_JOB_SLICE_S = env_float("BATCH_JOB_SLICE_S", 60.0)
BATCH_JOB_LEASE_S = env_float("BATCH_JOB_LEASE_S", 30.0)
BATCH_JOB_RESUME_S = env_float("BATCH_JOB_RESUME_S", 15.0)

# --- scheduling -----------------------------------------------------------------------------
# Defaults for the tier policies, written to the database when it is created; after that
# the policies are edited in the console and apply within a second, without a restart.
# Buckets: per client (`bucket_*`) and per tier (`tier_bucket_*`); `max_queued` bounds the
# tier's queue, `wait_slo_s` is the longest predicted wait still admitted, `max_wait_s` the
# longest a queued request waits before it expires.
RATE_LIMIT_POLICIES = {
    "vip": {
        "bucket_capacity": env_int("RATE_LIMIT_VIP_CAPACITY", 20),
        "refill_per_s": env_float("RATE_LIMIT_VIP_REFILL_PER_S", 1.0),
        "tier_bucket_capacity": env_int("RATE_LIMIT_VIP_TIER_CAPACITY", 1000),
        "tier_refill_per_s": env_float("RATE_LIMIT_VIP_TIER_REFILL_PER_S", 100.0),
        "max_concurrent_per_user": env_int("MAX_CONCURRENT_VIP", 8),
        "max_queued": env_int("QUEUE_MAX_VIP", 200),
        "wait_slo_s": env_float("WAIT_SLO_VIP_S", 10.0),
        "max_wait_s": env_float("MAX_WAIT_VIP_S", 30.0),
    },
    "normal": {
        "bucket_capacity": env_int("RATE_LIMIT_NORMAL_CAPACITY", 6),
        "refill_per_s": env_float("RATE_LIMIT_NORMAL_REFILL_PER_S", 0.2),
        "tier_bucket_capacity": env_int("RATE_LIMIT_NORMAL_TIER_CAPACITY", 1000),
        "tier_refill_per_s": env_float("RATE_LIMIT_NORMAL_TIER_REFILL_PER_S", 50.0),
        "max_concurrent_per_user": env_int("MAX_CONCURRENT_NORMAL", 3),
        "max_queued": env_int("QUEUE_MAX_NORMAL", 500),
        "wait_slo_s": env_float("WAIT_SLO_NORMAL_S", 60.0),
        "max_wait_s": env_float("MAX_WAIT_NORMAL_S", 120.0),
    },
    "batch": {
        "bucket_capacity": env_int("RATE_LIMIT_BATCH_CAPACITY", 1000),
        "refill_per_s": env_float("RATE_LIMIT_BATCH_REFILL_PER_S", 10.0),
        "tier_bucket_capacity": env_int("RATE_LIMIT_BATCH_TIER_CAPACITY", 10000),
        "tier_refill_per_s": env_float("RATE_LIMIT_BATCH_TIER_REFILL_PER_S", 100.0),
        "max_concurrent_per_user": env_int("MAX_CONCURRENT_BATCH", 1000),
        "max_queued": env_int("QUEUE_MAX_BATCH", 5000),
        "wait_slo_s": env_float("WAIT_SLO_BATCH_S", 86400.0),
        "max_wait_s": env_float("MAX_WAIT_BATCH_S", 86400.0),
    },
}
# One bucket for all traffic, sized to what the engines can take.
GLOBAL_RATE_LIMIT_CAPACITY = env_int("GLOBAL_RATE_LIMIT_CAPACITY", 400)
GLOBAL_RATE_LIMIT_REFILL_PER_S = env_float("GLOBAL_RATE_LIMIT_REFILL_PER_S", 40.0)
# Guests are identified by their session; a per-address bucket (this many times a client's)
# stops a flood of fresh sessions from one address. X-Forwarded-For counts only when the
# request comes from one of these proxy addresses.
GUEST_ADDRESS_BUCKET_FACTOR = env_int("GUEST_ADDRESS_BUCKET_FACTOR", 4)
TRUSTED_PROXIES = env_list("TRUSTED_PROXIES", [])
# Off: every tier shares the normal queue in arrival order (plain FIFO, a benchmark baseline).
SCHEDULER_PRIORITY = env_bool("SCHEDULER_PRIORITY", True)
# Inside each tier, share the workers' slots between sources (chat customers, API keys, batch
# owners) by tokens served (scheduler/fair_share.py); off: arrival order.
FAIR_SHARE = env_bool("FAIR_SHARE", True)
# The most tokens of service a source that was idle may be ahead of the busiest-served waiting
# one when it starts waiting again: what an idle spell banks.
FAIR_SHARE_IDLE_CREDIT_TOKENS = env_int("FAIR_SHARE_IDLE_CREDIT_TOKENS", 256)
# The most sources a tier remembers the counters of: past it, the least-served are forgotten
# (each starts at the floor less the idle credit when it comes back). Bounds the counters of a
# stream of one-off sources, each served less than the credit.
FAIR_SHARE_SOURCES_KEPT = env_int("FAIR_SHARE_SOURCES_KEPT", 10_000)
# What a prompt token counts for its source's share beside an answer's token (VTC's w_p, w_q
# being 1): prefill is batched and the help center's prefix is cached, decoding holds a slot.
FAIR_SHARE_PROMPT_TOKEN_WEIGHT = env_float("FAIR_SHARE_PROMPT_TOKEN_WEIGHT", 0.25)
# With every slot busy, a job of a source served less pauses the youngest answer of the source
# holding the most slots (it resumes from its streamed text), instead of waiting for one to end.
FAIR_SHARE_PREEMPTION = env_bool("FAIR_SHARE_PREEMPTION", True)
# How long such a job waits since it was queued, for a slot to turn over, before it pauses an
# answer (0: at once): a pause costs the engine the paused answer's prefill again. 1 s measured
# best beside a flooding key (docs/BENCHMARKS.md, section 15).
FAIR_SHARE_PREEMPT_AFTER_S = env_float("FAIR_SHARE_PREEMPT_AFTER_S", 1.0)
# With several workers for a model, a conversation's next turn is left this long for the worker
# that answered its previous one (its prefix cache holds the conversation) before any worker
# takes it; 0: no affinity. A worker that drains or stops heartbeating loses it at once. With
# two CPU workers of the shipped model a turn waited 0.07 s at most by the p99 for it, and its
# TTFT was neither lower nor higher than without (docs/BENCHMARKS.md, section 16): it is for
# where a prefill is dear (a larger model, more workers), not measured here.
AFFINITY_WAIT_S = env_float("AFFINITY_WAIT_S", 0.25)
# How long a conversation remembers the worker of its latest turn.
AFFINITY_TTL_S = env_int("AFFINITY_TTL_S", 3600)
# A normal request waiting longer than this is claimed before VIP ones (no starvation).
NORMAL_AGING_S = env_float("NORMAL_AGING_S", 20.0)
# Batch jobs (submit-then-poll) never hold more than this many slots of a worker.
BATCH_MAX_SLOTS = env_int("BATCH_MAX_SLOTS", 4)
# Answer and hand-off streams one web process holds open for one client (an account, a guest)
# and for one address (IPv6: its /64); one more is refused with 429. A customer's tabs each hold
# an answer's stream and their conversation's events; nginx caps connections per address too.
STREAMS_MAX_PER_CLIENT = env_int("STREAMS_MAX_PER_CLIENT", 16)
STREAMS_MAX_PER_ADDRESS = env_int("STREAMS_MAX_PER_ADDRESS", 64)
# A stream with no client attached for this long is cancelled.
STREAM_DISCONNECT_GRACE_S = env_float("STREAM_DISCONNECT_GRACE_S", 30.0)
JOB_LEASE_S = env_float("JOB_LEASE_S", 15.0)
JOB_MAX_ATTEMPTS = env_int("JOB_MAX_ATTEMPTS", 3)
WORKER_HEARTBEAT_S = env_float("WORKER_HEARTBEAT_S", 1.0)
WORKER_HEARTBEAT_TTL_S = env_float("WORKER_HEARTBEAT_TTL_S", 5.0)
WORKER_DRAIN_TIMEOUT_S = env_float("WORKER_DRAIN_TIMEOUT_S", 30.0)
# How long the process manager waits after SIGTERM before it kills a worker (Kubernetes'
# terminationGracePeriodSeconds, systemd's TimeoutStopSec; `make run` waits this long). The
# drain must end within it, leaving time to hand jobs back and stop the engine.
WORKER_TERMINATION_GRACE_S = env_float("WORKER_TERMINATION_GRACE_S", 40.0)
# A worker's guess of how long an answer takes until it has measured some (wait predictions).
SERVICE_TIME_PRIOR_S = env_float("SERVICE_TIME_PRIOR_S", 10.0)
# The autoscaling signal (llm_workers_desired): admitted arrivals are averaged over this window,
# and workers are asked for so that they are busy at most this share of the time, which leaves
# room for a burst between two scaling decisions.
AUTOSCALE_ARRIVAL_WINDOW_S = env_float("AUTOSCALE_ARRIVAL_WINDOW_S", 30.0)
AUTOSCALE_TARGET_UTILIZATION = env_float("AUTOSCALE_TARGET_UTILIZATION", 0.8)

# --- metrics ----------------------------------------------------------------------------------
# /metrics (web) and the worker's exporter answer a scraper that sends `Authorization: Bearer
# <METRICS_TOKEN>`; with no token set, one whose address is in METRICS_ALLOWED_NETWORKS.
METRICS_TOKEN = env_str("METRICS_TOKEN", "")
METRICS_ALLOWED_NETWORKS = env_list("METRICS_ALLOWED_NETWORKS", ["127.0.0.1/32", "::1/128"])
# Each inference worker serves its own /metrics here; 0 turns the exporter off. Workers sharing
# a host need a port each (`make run` gives its one worker 9464).
WORKER_METRICS_PORT = env_int("WORKER_METRICS_PORT", 0)
WORKER_METRICS_ADDR = env_str("WORKER_METRICS_ADDR", "127.0.0.1")

# --- console ----------------------------------------------------------------------------------
# How often Celery beat evaluates a running canary's rollback rules and step plan.
CANARY_EVALUATION_S = env_float("CANARY_EVALUATION_S", 30.0)
# The longest a variant's quality score (python -m bench quality's questions, asked through the
# batch queue) may take before it counts as failed; a running one blocks another until then.
QUALITY_RUN_TIMEOUT_S = env_float("QUALITY_RUN_TIMEOUT_S", 1800.0)
# How often the live dashboard's snapshot is computed (once for every open tab) and pushed.
CONSOLE_LIVE_PERIOD_S = env_float("CONSOLE_LIVE_PERIOD_S", 1.0)

# --- inference worker -----------------------------------------------------------------------
INFERENCE_ENGINE = env_str("INFERENCE_ENGINE", "vllm")
INFERENCE_MODEL = env_str("INFERENCE_MODEL", str(VAR_DIR / "models" / "SmolLM2-135M-Instruct"))
# The name this worker serves its model under: it answers every variant (scheduler.models.Variant)
# whose `model` is this name. Queues, capacity, autoscaling and the warm pool are per model name.
INFERENCE_MODEL_NAME = env_str("INFERENCE_MODEL_NAME", Path(INFERENCE_MODEL).name)
INFERENCE_MAX_NUM_SEQS = env_int("INFERENCE_MAX_NUM_SEQS", 16)
INFERENCE_MAX_MODEL_LEN = env_int("INFERENCE_MAX_MODEL_LEN", 2048)
# What the engine computes in: "auto" is vLLM's choice (the model's dtype) on a GPU and on a CPU
# that computes bfloat16 natively, float32 on one that does not (inference.engines.vllm.engine_dtype).
INFERENCE_DTYPE = env_str("INFERENCE_DTYPE", "auto")
# Tokens per KV-cache block, the unit vLLM's prefix cache reuses: a prompt's cached part is
# rounded down to whole blocks. 0 is vLLM's choice (16 on a GPU, 128 on a CPU, where a chat
# turn's few hundred tokens then reuse little of the last turn's).
INFERENCE_BLOCK_SIZE = env_int("INFERENCE_BLOCK_SIZE", 0)
# Room for 16 answers of 2048 tokens in float32 (half of it in bfloat16).
INFERENCE_KV_CACHE_GIB = env_int("INFERENCE_KV_CACHE_GIB", 2)
INFERENCE_GPU_MEMORY_UTILIZATION = env_float("INFERENCE_GPU_MEMORY_UTILIZATION", 0.9)
VIP_RESERVED_SLOTS = env_int("VIP_RESERVED_SLOTS", 2)
# A VIP job that finds every slot busy pauses the youngest normal (or batch) answer, which
# resumes from its streamed text when a slot frees, instead of waiting for a slot to turn over.
VIP_PREEMPTION = env_bool("VIP_PREEMPTION", True)
# How long a VIP job that finds every slot busy waits for a slot to turn over before an answer
# is paused for it: most get one meanwhile, and no answer pays the pause (BENCHMARKS.md, 5).
VIP_PREEMPT_AFTER_S = env_float("VIP_PREEMPT_AFTER_S", 0.25)
# The simulated engine's cost model (seconds); zero costs make it a pure token source.
SIMULATED_PREFILL_S_PER_TOKEN = env_float("SIMULATED_PREFILL_S_PER_TOKEN", 0.0002)
SIMULATED_DECODE_BASE_S = env_float("SIMULATED_DECODE_BASE_S", 0.02)
SIMULATED_DECODE_PER_SEQ_S = env_float("SIMULATED_DECODE_PER_SEQ_S", 0.002)
SIMULATED_OUTPUT_TOKENS = env_int("SIMULATED_OUTPUT_TOKENS", 40)
# Share of requests (0..1) the simulated engine fails after a few tokens, e.g. on a candidate.
SIMULATED_FAILURE_RATE = env_float("SIMULATED_FAILURE_RATE", 0.0)
# Seconds the simulated engine takes to start, standing in for loading a model's weights.
SIMULATED_START_S = env_float("SIMULATED_START_S", 0.0)

# Mounts the bare SSE endpoint the fan-out benchmark compares against (never in production).
BENCH_ENDPOINTS = env_bool("BENCH_ENDPOINTS", False)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {"django.channels.server": {"level": "WARNING"}},
}

CELERY_BEAT_SCHEDULE = {
    "purge-guest-conversations": {"task": "chat.tasks.purge_guest_conversations", "schedule": 3600.0},
    "purge-expired-sessions": {"task": "chat.tasks.purge_expired_sessions", "schedule": 3600.0},
    # An evaluation that could not start within its period is skipped: the next one follows.
    "canary-evaluate": {
        "task": "admin_console.tasks.canary_evaluate",
        "schedule": CANARY_EVALUATION_S,
        "options": {"expires": CANARY_EVALUATION_S},
    },
    "resume-batch-jobs": {"task": "api.tasks.jobs_resume", "schedule": BATCH_JOB_RESUME_S},
}
