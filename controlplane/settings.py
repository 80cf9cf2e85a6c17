"""Settings for the control plane, read from environment variables: each defined here once, typed, with
its default (``contracts.env``), and listed in docs/configuration.md; the rest of the control plane
reads ``django.conf.settings``, never the environment.

Embedded default (nothing set): SQLite under var/, Celery over kombu's filesystem transport under
var/broker, an in-process channel layer and a SQLite cache under var/cache. Service mode: DATABASE_URL
(PostgreSQL), CELERY_BROKER_URL (redis:// or amqp://), CHANNEL_REDIS_URL (redis://) and MOTLEY_CACHE_URL
(redis://, default CHANNEL_REDIS_URL). See docs/architecture.md.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import dj_database_url

from contracts.env import env_bool, env_float, env_int, env_list, env_path, env_str
from contracts.tasks import CALIBRATE, NODE_HEALTH_CHECK, REBALANCE_EVALUATE, RECONCILE_ALL

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = env_path("MOTLEY_VAR_DIR", BASE_DIR / "var").resolve()
VAR_DIR.mkdir(parents=True, exist_ok=True)


def _secret_key() -> str:
    """An explicit MOTLEY_SECRET_KEY, else one generated once per install and kept under var/."""
    if key := env_str("MOTLEY_SECRET_KEY", ""):
        return key
    path = VAR_DIR / "secret_key"
    if not path.exists():
        import secrets

        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


SECRET_KEY = _secret_key()
DEBUG = env_bool("MOTLEY_DEBUG", False)
ALLOWED_HOSTS = env_str("MOTLEY_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver").split(",")
CSRF_TRUSTED_ORIGINS = [o for o in env_str("MOTLEY_CSRF_TRUSTED_ORIGINS", "").split(",") if o]

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI's files, served locally (nothing from a CDN)
    "channels",
    "controlplane.ops",
    "controlplane.plans",
    "controlplane.common",
    "controlplane.audit",
    "controlplane.inventory",
    "controlplane.models_catalog",
    "controlplane.gateway",
    "controlplane.deployments",
    "controlplane.enrollment",
    "controlplane.telemetry",
    "controlplane.rebalance",
    "controlplane.dashboard",
]

MIDDLEWARE = [
    # Bodies over the API's or the gateway's limit are refused (413) before anything reads them.
    "controlplane.common.body_limit.BodyLimitMiddleware",
    "controlplane.gateway.limits.GatewayBodyLimit",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

# The API's request body limit (413 beyond; the gateway's /v1/ has MOTLEY_GATEWAY["MAX_BODY_BYTES"], which
# must not be larger). Django's default, 2.5 MiB.
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("MOTLEY_API_MAX_BODY_BYTES", 2621440)

ROOT_URLCONF = "controlplane.urls"
ASGI_APPLICATION = "controlplane.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "frontend" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

DATABASES = {
    "default": dj_database_url.config(
        default=f"sqlite:///{VAR_DIR / 'motley.sqlite3'}",
        conn_max_age=env_int("MOTLEY_DB_CONN_MAX_AGE", 0),
    )
}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # Several processes (ASGI server, Celery worker) share the file: wait on locks instead of failing.
    DATABASES["default"].setdefault("OPTIONS", {})["timeout"] = 20
    DATABASES["default"]["OPTIONS"]["init_command"] = "PRAGMA journal_mode=WAL;"
    # Take the write lock when a transaction begins: a read transaction that later writes cannot
    # wait for the lock (SQLite answers "database is locked" at once), an IMMEDIATE one can.
    DATABASES["default"]["OPTIONS"]["transaction_mode"] = "IMMEDIATE"

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "frontend" / "static"]
STATICFILES_FINDERS = [
    "django.contrib.staticfiles.finders.FileSystemFinder",
    "django.contrib.staticfiles.finders.AppDirectoriesFinder",
    "controlplane.dashboard.staticfiles.PlotlyFinder",  # vendor/plotly.min.js from the plotly package
]
STATIC_ROOT = VAR_DIR / "static"
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # Token first: anonymous API calls then get 401 with a WWW-Authenticate header, not 403.
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    # Signed-in users read; changes need an operator (staff or the "operators" group).
    "DEFAULT_PERMISSION_CLASSES": ["controlplane.common.permissions.ReadOnlyUnlessOperator"],
    "DEFAULT_FILTER_BACKENDS": [
        "django_filters.rest_framework.DjangoFilterBackend",
        "rest_framework.filters.OrderingFilter",
    ],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 100,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "controlplane.common.errors.json_exception_handler",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "motley control plane API",
    "DESCRIPTION": "Inventory, models, plans and deployments of an LLM served across a mixed GPU fleet.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    # Error answers are documented too (controlplane/common/schema_errors.py).
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "controlplane.common.schema_errors.add_error_responses",
    ],
    # Two choice sets of fields named "source": a revision's (all four) and what a plan input may say.
    "ENUM_NAME_OVERRIDES": {
        "PlanRevisionSourceEnum": "controlplane.deployments.models.PlanRevision.Source",
        "PlanInputSourceEnum": "controlplane.deployments.api.serializers.PLAN_INPUT_SOURCES",
    },
}

# Celery: control tasks only; JSON only (nothing from the broker is ever unpickled).
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", "filesystem://")
CELERY_BROKER_TRANSPORT_OPTIONS = (
    {
        "data_folder_in": str(VAR_DIR / "broker"),
        "data_folder_out": str(VAR_DIR / "broker"),
        "processed_folder": str(VAR_DIR / "broker-processed"),
        "control_folder": str(VAR_DIR / "broker-control"),
        "store_processed": False,
        # kombu polls the folder every 1 s by default: up to 1 s per hop (reconcile to the worker,
        # start_stage to an agent), and an in-place handover's pause holds one such hop. Every 0.02 s
        # costs make run's idle system (16 processes) 10.9 % of one core against 9.1 % at 0.1 s
        # (2-core VM, 30 s each) and takes ~0.04 s off each hop.
        "polling_interval": env_float("MOTLEY_EMBEDDED_BROKER_POLL_S", 0.02),
    }
    if CELERY_BROKER_URL.startswith("filesystem")
    else {}
)
for _option in ("data_folder_in", "processed_folder", "control_folder"):
    if _folder := CELERY_BROKER_TRANSPORT_OPTIONS.get(_option):
        Path(_folder).mkdir(parents=True, exist_ok=True)
# kombu's own filesystem reader can take a message file before its bytes are written and stop the
# worker; this one waits for the writer (embedded_broker/transport.py).
CELERY_BROKER_TRANSPORT = (
    "embedded_broker.transport:Transport" if CELERY_BROKER_URL.startswith("filesystem") else None
)
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
# Late acks count a message against the prefetch limit until its task ends, and a countdown task
# (a handover's ``reconcile_later``) holds its slot while it waits. Redis's event loop raises the
# limit for those at once; the embedded broker's polling loop only every 2 s, so with 2 slots a
# reconcile asked for by an apply would wait there 5-6 s, inside an in-place handover's pause.
# Several messages a process cost nothing on a local folder.
CELERY_WORKER_PREFETCH_MULTIPLIER = 16 if CELERY_BROKER_URL.startswith("filesystem") else 1
CELERY_TASK_DEFAULT_QUEUE = "control"
# No result backend (nothing reads a task's result; tasks report through the agents' socket): Celery's
# DisabledBackend, stateless, so one instance serves every thread. Left per thread, every request
# that sends a task (an apply, a drain) built it again in its own thread (ASGI gives each request
# one), scanning every installed package's entry points: 3.7-7.5 ms of the server's time each
# (benchmarks/request_overhead_bench.py).
CELERY_RESULT_BACKEND_THREAD_SAFE = True
CELERY_TASK_ALWAYS_EAGER = env_bool("MOTLEY_CELERY_EAGER", False)

# Agents and the deployment controller (docs/deployments.md).
# The broker URL handed to agents at registration: the control plane's own unless agents on other
# hosts must reach the broker under another name.
# Where registering a model by path may read (os.pathsep-separated directories); unset: anywhere the
# control plane's user can read. Set it wherever API users are not all trusted with the filesystem.
MOTLEY_MODEL_DIRS = tuple(
    Path(d).expanduser().resolve() for d in env_list("MOTLEY_MODEL_DIRS", "", sep=os.pathsep)
)
# Where registering a GGUF file writes the checkpoint it converts it into (<dir>/<model name>/;
# docs/models.md), and the dtype it stores the weights in (float16 | bfloat16 | float32).
MOTLEY_MODEL_IMPORT_DIR = env_path("MOTLEY_MODEL_IMPORT_DIR", VAR_DIR / "models").expanduser().resolve()
MOTLEY_MODEL_IMPORT_DTYPE = env_str("MOTLEY_MODEL_IMPORT_DTYPE", "float16")
MOTLEY_AGENT_BROKER_URL = env_str("MOTLEY_AGENT_BROKER_URL", CELERY_BROKER_URL)
# Websocket messages clients send (controlplane/common/ws_limits.py): the largest, and how many a
# second (bursts of two seconds' worth); beyond, the socket is closed saying which limit.
MOTLEY_AGENT_WS_MAX_MESSAGE_BYTES = env_int("MOTLEY_AGENT_WS_MAX_MESSAGE_BYTES", 1024 * 1024)
MOTLEY_AGENT_WS_MESSAGES_PER_S = env_float("MOTLEY_AGENT_WS_MESSAGES_PER_S", 50)
MOTLEY_DASHBOARD_WS_MAX_MESSAGE_BYTES = env_int("MOTLEY_DASHBOARD_WS_MAX_MESSAGE_BYTES", 4096)
MOTLEY_DASHBOARD_WS_MESSAGES_PER_S = env_float("MOTLEY_DASHBOARD_WS_MESSAGES_PER_S", 20)
# Registration attempts one address may make a minute (429 beyond; 0: no limit): join tokens are secrets.
MOTLEY_AGENT_REGISTRATIONS_PER_MINUTE = env_int("MOTLEY_AGENT_REGISTRATIONS_PER_MINUTE", 60)
MOTLEY_AGENT_HEARTBEAT_INTERVAL_S = env_float("MOTLEY_AGENT_HEARTBEAT_INTERVAL_S", 1.0)
MOTLEY_NODE_SUSPECT_MISSED_HEARTBEATS = env_int("MOTLEY_NODE_SUSPECT_MISSED_HEARTBEATS", 3)
MOTLEY_NODE_LOST_AFTER_S = env_float("MOTLEY_NODE_LOST_AFTER_S", 15)
# A node whose agent's websocket closed abnormally (the agent died: the kernel closed its socket) and
# that was not heard from since is LOST after this, while other agents are heard after the close
# (docs/deployments.md, "Node liveness"); 0 turns this off.
MOTLEY_NODE_LOST_AFTER_CLOSE_S = env_float("MOTLEY_NODE_LOST_AFTER_CLOSE_S", 4)
# A re-plan after a loss or for a drain keeps the applied plan with only its stranded stages moved when
# that predicts at least (1 - this x the share of stages a fresh plan changes beyond it) of the fresh
# plan's throughput: the fresh plan pays for the stages it restarts (docs/deployments.md, "Re-plan").
MOTLEY_REPLAN_KEEP_WITHIN = env_float("MOTLEY_REPLAN_KEEP_WITHIN", 0.5)
MOTLEY_NODE_HEALTH_CHECK_INTERVAL_S = env_float("MOTLEY_NODE_HEALTH_CHECK_INTERVAL_S", 1.0)
MOTLEY_RECONCILE_INTERVAL_S = env_float("MOTLEY_RECONCILE_INTERVAL_S", 10)
# A start (or stop) not confirmed by the agent within this time is sent again (loading takes a while).
MOTLEY_STAGE_START_TIMEOUT_S = env_float("MOTLEY_STAGE_START_TIMEOUT_S", 120)
MOTLEY_STAGE_PORTS = tuple(int(p) for p in env_str("MOTLEY_STAGE_PORTS", "5600-5999").split("-", 1))
MOTLEY_STAGE_THREADS = env_int("MOTLEY_STAGE_THREADS", 1)
MOTLEY_STAGE_PEER_TIMEOUT_S = env_float("MOTLEY_STAGE_PEER_TIMEOUT_S", 5.0)
# Handover (docs/deployments.md, "Handover (make before break)"): how long a replaced pipeline keeps
# admitting after the switch (2x the gateway's REFRESH_S, so every gateway process has seen the new
# one), and how long after its head was stopped its other stages are stopped even if the head has not
# exited (the head drains for up to its peer_timeout_s; the agent kills it 2 s after that).
MOTLEY_HANDOVER_SWITCH_S = env_float("MOTLEY_HANDOVER_SWITCH_S", 4.0)
MOTLEY_HANDOVER_DRAIN_S = env_float("MOTLEY_HANDOVER_DRAIN_S", 10.0)
MOTLEY_EMULATION_TIME_SCALE = env_float("MOTLEY_EMULATION_TIME_SCALE", 20)
# Host memory each stage may fill with KV blocks evicted from its device, where the planner finds copying
# them back cheaper than recomputing them (docs/planner.md, "Host KV tier").
MOTLEY_HOST_KV_GIB = env_float("MOTLEY_HOST_KV_GIB", 4.0)
# How long a card must stay throttled before it is observed DEGRADED (controlplane/inventory/health.py).
MOTLEY_DEVICE_THROTTLE_SUSTAINED_S = env_float("MOTLEY_DEVICE_THROTTLE_SUSTAINED_S", 10.0)
# Latest telemetry (controlplane/telemetry/selectors.py): how long a node's latest sample stays in the
# cache, and the age past which a reader should not trust it (default: the SUSPECT threshold).
MOTLEY_TELEMETRY_SAMPLE_TTL_S = env_float("MOTLEY_TELEMETRY_SAMPLE_TTL_S", 30)
MOTLEY_TELEMETRY_STALE_AFTER_S = env_float(
    "MOTLEY_TELEMETRY_STALE_AFTER_S",
    MOTLEY_AGENT_HEARTBEAT_INTERVAL_S * MOTLEY_NODE_SUSPECT_MISSED_HEARTBEATS,
)
# Stored events (controlplane/deployments/events.py): kept per deployment (and fleet-wide, for events of
# no deployment), and for at most this many days.
MOTLEY_EVENTS_KEEP = env_int("MOTLEY_EVENTS_KEEP", 500)
MOTLEY_EVENTS_RETENTION_DAYS = env_float("MOTLEY_EVENTS_RETENTION_DAYS", 30)
# Dashboard telemetry (docs/dashboard.md): per-second history kept in memory for the live charts,
# rollup bucket length, how long rollups stay in the database, and the browser snapshot interval.
MOTLEY_TELEMETRY_HISTORY_S = env_float("MOTLEY_TELEMETRY_HISTORY_S", 300)
MOTLEY_TELEMETRY_ROLLUP_S = env_int("MOTLEY_TELEMETRY_ROLLUP_S", 10)
MOTLEY_TELEMETRY_RETENTION_HOURS = env_float("MOTLEY_TELEMETRY_RETENTION_HOURS", 24)
MOTLEY_DASHBOARD_SNAPSHOT_INTERVAL_S = env_float("MOTLEY_DASHBOARD_SNAPSHOT_INTERVAL_S", 0.5)
# Request timeline (docs/observability.md): sampled spans kept (at most this many, none older), and the
# operator's tracing UI, "{trace_id}" in its URL replaced by the trace's id ("": no link).
MOTLEY_TRACE_SPANS_KEPT = env_int("MOTLEY_TRACE_SPANS_KEPT", 20000)
MOTLEY_TRACE_MAX_AGE_S = env_float("MOTLEY_TRACE_MAX_AGE_S", 3600)
MOTLEY_TRACING_UI_URL = env_str("MOTLEY_TRACING_UI_URL", "")
# Calibration (docs/planner.md, "Calibration"): a pass every interval turns each fresh stage sample
# into one observation (measured / predicted decode step) of its device and precision; a window keeps
# the newest (at most WINDOW, none older than WINDOW_S), its median is the ratio, which the planner
# uses from MIN_SAMPLES observations on; a change by more than EVENT_CHANGE is recorded as an event.
MOTLEY_CALIBRATION_INTERVAL_S = env_float("MOTLEY_CALIBRATION_INTERVAL_S", 2)
MOTLEY_CALIBRATION_WINDOW = env_int("MOTLEY_CALIBRATION_WINDOW", 30)
MOTLEY_CALIBRATION_WINDOW_S = env_float("MOTLEY_CALIBRATION_WINDOW_S", 600)
MOTLEY_CALIBRATION_MIN_SAMPLES = env_int("MOTLEY_CALIBRATION_MIN_SAMPLES", 8)
MOTLEY_CALIBRATION_MIN_DECODE_STEPS = env_int("MOTLEY_CALIBRATION_MIN_DECODE_STEPS", 3)
MOTLEY_CALIBRATION_EVENT_CHANGE = env_float("MOTLEY_CALIBRATION_EVENT_CHANGE", 0.1)
# The rebalance policy (docs/deployments.md, "Rebalance policy"): a pass every INTERVAL_S over each READY
# deployment whose policy is not off; a drift beyond DRIFT, a throttle, forecast load (over DEMAND_WINDOW_S)
# over DEMAND_HIGH or under DEMAND_LOW of capacity, each lasting DRIFT_FOR_S, and the fleet changing trigger
# it; every CHECK_S it asks for a better plan, acts on a gain of MIN_GAIN, not within COOLDOWN_S of a change.
MOTLEY_REBALANCE_INTERVAL_S = env_float("MOTLEY_REBALANCE_INTERVAL_S", 10)
MOTLEY_REBALANCE_DRIFT = env_float("MOTLEY_REBALANCE_DRIFT", 0.25)
MOTLEY_REBALANCE_DRIFT_FOR_S = env_float("MOTLEY_REBALANCE_DRIFT_FOR_S", 60)
MOTLEY_REBALANCE_MIN_GAIN = env_float("MOTLEY_REBALANCE_MIN_GAIN", 0.15)
MOTLEY_REBALANCE_COOLDOWN_S = env_float("MOTLEY_REBALANCE_COOLDOWN_S", 300)
MOTLEY_REBALANCE_CHECK_S = env_float("MOTLEY_REBALANCE_CHECK_S", 300)
MOTLEY_REBALANCE_DEMAND_HIGH = env_float("MOTLEY_REBALANCE_DEMAND_HIGH", 0.8)
MOTLEY_REBALANCE_DEMAND_LOW = env_float("MOTLEY_REBALANCE_DEMAND_LOW", 0.5)
MOTLEY_REBALANCE_DEMAND_WINDOW_S = env_float("MOTLEY_REBALANCE_DEMAND_WINDOW_S", 60)
CELERY_BEAT_SCHEDULE = {
    "node-health-check": {
        "task": NODE_HEALTH_CHECK,
        "schedule": MOTLEY_NODE_HEALTH_CHECK_INTERVAL_S,
        # Not the interval: on a busy worker (a reconcile, a rebalance pass planning) every check
        # expired unrun and a dead node stayed READY for a minute (seen under load in the multi-host
        # test). A late check is as right as a prompt one: it compares heartbeats with its own now.
        "options": {"expires": max(5.0, 5 * MOTLEY_NODE_HEALTH_CHECK_INTERVAL_S)},
    },
    "reconcile-all": {
        "task": RECONCILE_ALL,
        "schedule": MOTLEY_RECONCILE_INTERVAL_S,
        "options": {"expires": MOTLEY_RECONCILE_INTERVAL_S},
    },
    "calibrate": {
        "task": CALIBRATE,
        "schedule": MOTLEY_CALIBRATION_INTERVAL_S,
        # Not the interval: behind the health checks on a busy worker, passes would expire unrun. A
        # late pass reads the latest samples all the same; one read twice counts once.
        "options": {"expires": max(5.0, 3 * MOTLEY_CALIBRATION_INTERVAL_S)},
    },
    "rebalance": {
        "task": REBALANCE_EVALUATE,
        "schedule": MOTLEY_REBALANCE_INTERVAL_S,
        "options": {"expires": MOTLEY_REBALANCE_INTERVAL_S},
    },
}

# The OpenAI-compatible gateway (docs/gateway.md): MOTLEY_GATEWAY overrides the defaults of
# controlplane/gateway/conf.py (DEFAULTS, one per key: deadlines, limits, waits); a JSON file of served
# models to use instead of the deployments (read when MOTLEY_GATEWAY sets no MODELS_FILE).
MOTLEY_GATEWAY: dict[str, Any] = {}
MOTLEY_GATEWAY_MODELS_FILE = env_str("MOTLEY_GATEWAY_MODELS_FILE", "")

CHANNEL_REDIS_URL = env_str("CHANNEL_REDIS_URL", "")
CHANNEL_LAYERS = {
    "default": (
        {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": [CHANNEL_REDIS_URL]}}
        if CHANNEL_REDIS_URL
        else {"BACKEND": "channels.layers.InMemoryChannelLayer"}
    )
}

# The cache every process shares (docs/architecture.md, "Run modes"): the latest telemetry sample of
# each node, read by the dashboard, the gateway's router and calibration in the Celery worker. Service
# mode: Redis (MOTLEY_CACHE_URL, default the channel layer's), values stored as JSON (nothing read from
# the network is unpickled), short socket timeouts (telemetry is lossy; a slow Redis must not stall an
# event loop). Embedded default: a SQLite file under var/cache/ (common/sqlite_cache.py) that the ASGI
# server and the Celery worker both read. Never cache.clear() Redis: the channel layer lives there too.
MOTLEY_CACHE_URL = env_str("MOTLEY_CACHE_URL", CHANNEL_REDIS_URL)
CACHES = {
    "default": (
        {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": MOTLEY_CACHE_URL,
         "KEY_PREFIX": "motley",
         "OPTIONS": {"serializer": "controlplane.common.cache.JsonSerializer",
                     "socket_connect_timeout": 0.5, "socket_timeout": 0.5}}
        if MOTLEY_CACHE_URL.startswith(("redis://", "rediss://", "unix://"))
        else {"BACKEND": "controlplane.common.sqlite_cache.SqliteCache",
              "LOCATION": str(VAR_DIR / "cache" / "cache.sqlite3"), "OPTIONS": {"MAX_ENTRIES": 100_000}}
    )
}

# Prometheus metrics (docs/observability.md): GET /metrics answers a scraper that presents
# MOTLEY_METRICS_TOKEN as "Authorization: Bearer <token>", or one calling from an address in
# MOTLEY_METRICS_ALLOW (networks, comma-separated; default loopback only; empty: none). Several server
# processes keep their request metrics in PROMETHEUS_MULTIPROC_DIR (prometheus_client's; run_local's).
MOTLEY_METRICS_TOKEN = env_str("MOTLEY_METRICS_TOKEN", "")
MOTLEY_METRICS_ALLOW = env_list("MOTLEY_METRICS_ALLOW", "127.0.0.1/8,::1/128")
# The load balancers (networks) whose X-Forwarded-For names the client (common/client_address.py).
MOTLEY_TRUSTED_PROXIES = env_list("MOTLEY_TRUSTED_PROXIES", "")

LOGGING = {
    "version": 1, "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("MOTLEY_LOG_LEVEL", "INFO")},
}
