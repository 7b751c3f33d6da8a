"""Switchyard settings, read from the environment through ``console.env``.

Defaults are demo-safe (SQLite and Redis on 127.0.0.1). ``SWITCHYARD_PRODUCTION=true`` turns on
production mode: a SECRET_KEY and allowed hosts must be given, cookies are secure and
``manage.py check --deploy`` passes.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from console.env import env_bool, env_float, env_int, env_list, env_secret, env_str

BASE_DIR = Path(__file__).resolve().parent.parent

PRODUCTION = env_bool("SWITCHYARD_PRODUCTION", False)
DEBUG = env_bool("SWITCHYARD_DEBUG", False)
if PRODUCTION and DEBUG:
    raise ImproperlyConfigured("SWITCHYARD_DEBUG cannot be true when SWITCHYARD_PRODUCTION is true")

# Where local runtimes, model repositories, logs and the SQLite demo database live.
DATA_DIR = Path(env_str("SWITCHYARD_DATA_DIR", str(BASE_DIR / ".switchyard"))).resolve()

SECRET_KEY = env_secret("SECRET_KEY")
if not SECRET_KEY:
    if PRODUCTION:
        raise ImproperlyConfigured(
            "SECRET_KEY (or SECRET_KEY_FILE) must be set when SWITCHYARD_PRODUCTION is true"
        )
    SECRET_KEY = "switchyard-demo-only-not-secret-" + "x" * 32
elif PRODUCTION and len(SECRET_KEY) < 50:
    raise ImproperlyConfigured("SECRET_KEY must be at least 50 characters in production")

ALLOWED_HOSTS = env_list(
    "SWITCHYARD_ALLOWED_HOSTS", [] if PRODUCTION else ["127.0.0.1", "localhost", "[::1]"]
)
if PRODUCTION and not ALLOWED_HOSTS:
    raise ImproperlyConfigured("SWITCHYARD_ALLOWED_HOSTS must list the host names in production")
CSRF_TRUSTED_ORIGINS = env_list("SWITCHYARD_CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_htmx",
    "template_partials",
    "axes",
    "csp",
    "console",
    "fleet",
    "rollouts",
    "local",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # First: every line logged while serving a request names its id, answered back.
    "console.logs.RequestIdMiddleware",
    # Counts and times every request by view for /metrics (console.instrument).
    "console.instrument.RequestMetricsMiddleware",
    # Before anything reads the session, the user or a form: NUL characters are a 400 here.
    "console.middleware.RefuseNulCharactersMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "console.htmx.HtmxLoginMiddleware",
    "csp.middleware.CSPMiddleware",
    # Last: turns a locked-out login into the login page saying why (fleet.tenancy.lockouts).
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "console.urls"
# Under /api/ a CSRF failure answers JSON like every API error (console.errors).
CSRF_FAILURE_VIEW = "console.errors.csrf_failure"
WSGI_APPLICATION = "console.wsgi.application"
ASGI_APPLICATION = "console.asgi.application"

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
                "console.context_processors.switchyard",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.parse(
        env_str("DATABASE_URL", f"sqlite:///{DATA_DIR / 'switchyard.sqlite3'}"),
        conn_max_age=env_int("SWITCHYARD_DB_CONN_MAX_AGE", 0, minimum=0),
        # A connection kept between requests is checked (SELECT 1) before a request first
        # uses it, so one the database closed meanwhile (a restart, a failover) is replaced
        # instead of failing that request.
        conn_health_checks=env_bool("SWITCHYARD_DB_CONN_HEALTH_CHECKS", True),
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    # Take the write lock when a transaction starts, so read-then-write checks (quota
    # admission) cannot interleave; PostgreSQL gets the same from SELECT ... FOR UPDATE.
    DATABASES["default"].setdefault("OPTIONS", {}).update(transaction_mode="IMMEDIATE", timeout=20)
    # A file, not memory, so a real Celery worker process in the tests sees the test database;
    # one per test process, so two test runs never share one.
    DATABASES["default"]["TEST"] = {"NAME": str(DATA_DIR / f"test-{os.getpid()}.sqlite3")}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
# Brute-force protection (fleet/tenancy/lockouts.py): django-axes refuses logins, on the console and in
# the admin, for a cool-off once an account or an address failed this many times; API tokens
# from an address that sent this many malformed or unknown ones are answered 429 as long.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
SWITCHYARD_LOGIN_FAILURE_LIMIT = env_int("SWITCHYARD_LOGIN_FAILURE_LIMIT", 10, minimum=1)
SWITCHYARD_LOGIN_COOLOFF_S = env_int("SWITCHYARD_LOGIN_COOLOFF_S", 900, minimum=1)
SWITCHYARD_TOKEN_FAILURE_LIMIT = env_int("SWITCHYARD_TOKEN_FAILURE_LIMIT", 20, minimum=1)
AXES_FAILURE_LIMIT = SWITCHYARD_LOGIN_FAILURE_LIMIT
AXES_COOLOFF_TIME = timedelta(seconds=SWITCHYARD_LOGIN_COOLOFF_S)
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]  # per account, and per address
AXES_LOCKOUT_CALLABLE = "fleet.tenancy.lockouts.lockout_response"
AXES_CLIENT_IP_CALLABLE = "fleet.tenancy.lockouts.client_ip"
AXES_VERBOSE = False

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "console:dashboard"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = env_str("SWITCHYARD_STATIC_ROOT", "/srv/switchyard/static" if PRODUCTION else "") or None
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": (
            "whitenoise.storage.CompressedManifestStaticFilesStorage"
            if PRODUCTION
            else "django.contrib.staticfiles.storage.StaticFilesStorage"
        )
    },
}
# Outside production, serve straight from the source folders: no collectstatic step.
WHITENOISE_USE_FINDERS = not PRODUCTION

# Shown on the login page of the demo only, so a new user knows how to get in.
SWITCHYARD_DEMO_PASSWORD = "" if PRODUCTION else env_str("SWITCHYARD_DEMO_PASSWORD", "")

REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/0")

# Model loads (rollouts/loads/reconciler.py): artifacts from S3, a lease per claimed load, retries.
SWITCHYARD_S3_ENDPOINT_URL = env_str("SWITCHYARD_S3_ENDPOINT_URL", "") or None
SWITCHYARD_S3_REGION = env_str("SWITCHYARD_S3_REGION", "us-east-1")
# Unset: boto3's own chain (AWS_ACCESS_KEY_ID, instance roles, ~/.aws).
SWITCHYARD_S3_ACCESS_KEY_ID = env_secret("SWITCHYARD_S3_ACCESS_KEY_ID")
SWITCHYARD_S3_SECRET_ACCESS_KEY = env_secret("SWITCHYARD_S3_SECRET_ACCESS_KEY")
SWITCHYARD_ARTIFACT_CACHE = DATA_DIR / "cache" / "artifacts"
SWITCHYARD_LOAD_TIMEOUT_S = env_float("SWITCHYARD_LOAD_TIMEOUT_S", 120.0, minimum=1.0)
SWITCHYARD_LOAD_LEASE_S = env_float("SWITCHYARD_LOAD_LEASE_S", 30.0, minimum=1.0)
SWITCHYARD_LOAD_MAX_ATTEMPTS = env_int("SWITCHYARD_LOAD_MAX_ATTEMPTS", 5, minimum=1)
# Drain before unload (rollouts/loads/drain.py): a version taken off a routed server waits,
# after its traffic moved, until the router has no request left in flight to it, at most
# DRAIN_TIMEOUT_S; a router that cannot say is given DRAIN_GRACE_S after the route's change.
SWITCHYARD_DRAIN_TIMEOUT_S = env_float("SWITCHYARD_DRAIN_TIMEOUT_S", 30.0, minimum=0.0)
SWITCHYARD_DRAIN_GRACE_S = env_float("SWITCHYARD_DRAIN_GRACE_S", 2.0, minimum=0.0)
# How long a load waits for quota its cohort lent out to be given back (a cohort whose
# reclaim policy unloads borrowers) before it fails with the refusal.
SWITCHYARD_RECLAIM_WAIT_S = env_float("SWITCHYARD_RECLAIM_WAIT_S", 120.0, minimum=1.0)
SWITCHYARD_RECONCILE_INTERVAL_S = env_float("SWITCHYARD_RECONCILE_INTERVAL_S", 2.0, minimum=0.5)

# Live latency (rollouts/traffic/latency.py): scrape every server's /metrics this often.
SWITCHYARD_SCRAPE_INTERVAL_S = env_float("SWITCHYARD_SCRAPE_INTERVAL_S", 1.0, minimum=0.5)
SWITCHYARD_SCRAPE_TIMEOUT_S = env_float("SWITCHYARD_SCRAPE_TIMEOUT_S", 0.8, minimum=0.1)
# The shards the fleet's periodic work is split into (the latency scrape, rollouts/traffic/
# scrape_tick.py, and health probes, fleet/inventory/health.py): one task each per tick, which
# any worker takes under a lease in Redis.
SWITCHYARD_SHARDS = env_int("SWITCHYARD_SHARDS", 4, minimum=1)
# Route samples a worker process keeps between canary looks (about 50 bytes each): 100
# rollouts at 20,000 canary requests and as many baseline ones fit.
SWITCHYARD_LOOK_CACHE_ROWS = env_int("SWITCHYARD_LOOK_CACHE_ROWS", 4_000_000, minimum=0)
# Prefix of every Redis key Switchyard writes besides the Celery broker's (one Redis may serve
# several installations).
SWITCHYARD_REDIS_PREFIX = env_str("SWITCHYARD_REDIS_PREFIX", "switchyard")

# --- Celery (namespace CELERY_) ------------------------------------------------------------
CELERY_BROKER_URL = REDIS_URL
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A worker that lost the broker tries again forever, at most 1 s apart (console.celery.Consumer),
# so it takes tasks again within about a second of the broker coming back.
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
CELERY_WORKER_CONSUMER = "console.celery:Consumer"
# The worker logs through LOGGING below (the format chosen, each line's request id and subject),
# not through a root handler of Celery's own.
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": 300,
    # A broker that accepts connections but does not answer fails a command after 2 s instead
    # of holding it (and the web request that publishes) forever.
    "socket_connect_timeout": 2.0,
    "socket_timeout": 2.0,
}
# A publish fails fast when the broker is down: one retry (which replaces a connection the
# broker dropped when it restarted), then the caller logs it and beat's reconcile tick picks
# the work up (console.celery.send_soon). Celery's default makes 3 retries.
CELERY_TASK_PUBLISH_RETRY_POLICY = {
    "max_retries": 1, "interval_start": 0.1, "interval_step": 0.2, "interval_max": 0.2,
}
SWITCHYARD_HEALTH_INTERVAL_S = env_float("SWITCHYARD_HEALTH_INTERVAL_S", 3.0, minimum=1.0)
SWITCHYARD_PROBE_TIMEOUT_S = env_float("SWITCHYARD_PROBE_TIMEOUT_S", 2.0, minimum=0.1)
# Tenant webhooks (fleet/webhooks/): attempts per delivery, the first wait between two
# (doubled after each failure: 2, 4, 8, 16, 32 s), the POST timeout and the retry tick.
SWITCHYARD_WEBHOOK_MAX_ATTEMPTS = env_int("SWITCHYARD_WEBHOOK_MAX_ATTEMPTS", 6, minimum=1)
SWITCHYARD_WEBHOOK_BACKOFF_S = env_float("SWITCHYARD_WEBHOOK_BACKOFF_S", 2.0, minimum=0.1)
SWITCHYARD_WEBHOOK_TIMEOUT_S = env_float("SWITCHYARD_WEBHOOK_TIMEOUT_S", 5.0, minimum=0.1)
SWITCHYARD_WEBHOOK_INTERVAL_S = env_float("SWITCHYARD_WEBHOOK_INTERVAL_S", 2.0, minimum=0.5)
# Webhook URLs must reach public addresses only (fleet/webhooks/outbound.py); these hosts
# (a name or an address as written in the URL, optionally with :port) are let through, e.g. a
# receiver inside the platform's own network. Comma-separated; empty: none.
SWITCHYARD_WEBHOOK_ALLOWED_HOSTS = env_list("SWITCHYARD_WEBHOOK_ALLOWED_HOSTS", [])
# How long audit events are kept, in days (0: forever); a daily task deletes older ones and
# records that it did (fleet/audit/export.py).
SWITCHYARD_AUDIT_RETENTION_DAYS = env_int("SWITCHYARD_AUDIT_RETENTION_DAYS", 0, minimum=0)
CELERY_BEAT_SCHEDULE = {
    "end-quota-grants": {
        "task": "fleet.tasks.end_quota_grants",
        "schedule": timedelta(minutes=1),
        "options": {"expires": 60},
    },
    "prune-audit-events": {
        "task": "fleet.tasks.prune_audit",
        "schedule": timedelta(hours=24),
        "options": {"expires": 3600},
    },
    "scrape-latency": {
        "task": "rollouts.tasks.scrape_latency",
        "schedule": timedelta(seconds=SWITCHYARD_SCRAPE_INTERVAL_S),
        "options": {"expires": SWITCHYARD_SCRAPE_INTERVAL_S},
    },
    "prune-latency-rollups": {
        "task": "rollouts.tasks.prune_latency",
        "schedule": timedelta(hours=1),
        "options": {"expires": 600},
    },
    "prune-benchmark-files": {
        "task": "rollouts.tasks.prune_benchmark_files",
        "schedule": timedelta(hours=1),
        "options": {"expires": 600},
    },
    "reconcile-model-loads": {
        "task": "rollouts.tasks.reconcile_loads",
        "schedule": timedelta(seconds=SWITCHYARD_RECONCILE_INTERVAL_S),
        "options": {"expires": SWITCHYARD_RECONCILE_INTERVAL_S},
    },
    "check-inference-servers": {
        "task": "fleet.tasks.check_servers",
        "schedule": timedelta(seconds=SWITCHYARD_HEALTH_INTERVAL_S),
        # A tick that waited longer than one interval is stale: the next one supersedes it.
        "options": {"expires": SWITCHYARD_HEALTH_INTERVAL_S},
    },
    "retry-webhook-deliveries": {
        "task": "fleet.tasks.retry_webhook_deliveries",
        "schedule": timedelta(seconds=SWITCHYARD_WEBHOOK_INTERVAL_S),
        "options": {"expires": SWITCHYARD_WEBHOOK_INTERVAL_S},
    },
}

# The local cluster's Triton (see local/cluster.py).
SWITCHYARD_LOCAL_TRITON_HTTP_PORT = env_int("SWITCHYARD_LOCAL_TRITON_HTTP_PORT", 8100, minimum=1)
SWITCHYARD_LOCAL_TRITON_GRPC_PORT = env_int("SWITCHYARD_LOCAL_TRITON_GRPC_PORT", 8101, minimum=1)
SWITCHYARD_LOCAL_TRITON_METRICS_PORT = env_int(
    "SWITCHYARD_LOCAL_TRITON_METRICS_PORT", 8102, minimum=1
)

# --- Traffic routes (fleet/inventory/routers.py, rollouts/traffic/routes.py) --------------------------------------
# nginx sends every routed request's JSON sample as a UDP syslog message to this collector
# (rollouts.traffic.samples). On a static cluster nginx runs on another host: the host named here must
# be an address of this machine that the router's host can reach.
SWITCHYARD_COLLECTOR_HOST = env_str("SWITCHYARD_COLLECTOR_HOST", "127.0.0.1")
SWITCHYARD_COLLECTOR_PORT = env_int("SWITCHYARD_COLLECTOR_PORT", 5514, minimum=1)
# How long the collector keeps a Kubernetes route's variants (to map an Envoy gateway's lines).
SWITCHYARD_SAMPLES_ROUTE_CACHE_S = env_float("SWITCHYARD_SAMPLES_ROUTE_CACHE_S", 5.0, minimum=0.0)
# The local cluster's nginx: its prefix directory (the router's route files are in
# <prefix>/switchyard) and the port of its status page.
SWITCHYARD_LOCAL_NGINX_DIR = DATA_DIR / "local" / "nginx"
SWITCHYARD_LOCAL_NGINX_STATUS_PORT = env_int("SWITCHYARD_LOCAL_NGINX_STATUS_PORT", 8190, minimum=1)
# Where the local nginx's routes listen, and the host name their URLs give clients.
SWITCHYARD_LOCAL_ROUTE_LISTEN_HOST = env_str("SWITCHYARD_LOCAL_ROUTE_LISTEN_HOST", "127.0.0.1")
SWITCHYARD_LOCAL_ROUTE_PUBLIC_HOST = env_str("SWITCHYARD_LOCAL_ROUTE_PUBLIC_HOST", "")
# The ports routes listen on, "first-last": each deployment's route keeps one for its life.
_route_ports = env_str("SWITCHYARD_ROUTE_PORTS", "18100-18199")
try:
    _first_port, _last_port = (int(p) for p in _route_ports.split("-", 1))
except ValueError:
    raise ImproperlyConfigured(
        f"SWITCHYARD_ROUTE_PORTS must be a range such as 18100-18199, got {_route_ports!r}"
    ) from None
if not 1 <= _first_port <= _last_port <= 65535:
    raise ImproperlyConfigured(f"SWITCHYARD_ROUTE_PORTS is not a port range: {_route_ports!r}")
SWITCHYARD_ROUTE_PORTS = range(_first_port, _last_port + 1)
# A route change being applied holds its route this long at most (a worker that died while
# nginx reloaded leaves a claim that runs out).
SWITCHYARD_ROUTE_APPLY_LEASE_S = env_float("SWITCHYARD_ROUTE_APPLY_LEASE_S", 60.0, minimum=5.0)
SWITCHYARD_ROLLOUT_INTERVAL_S = env_float("SWITCHYARD_ROLLOUT_INTERVAL_S", 1.0, minimum=0.2)
SWITCHYARD_ROLLOUT_LEASE_S = env_float("SWITCHYARD_ROLLOUT_LEASE_S", 15.0, minimum=1.0)
# The platform's Prometheus, which analyses' metric gates (rollouts/canary/metrics.py) query
# through the metric templates platform admins write; empty: no metric gates.
SWITCHYARD_PROMETHEUS_URL = env_str("SWITCHYARD_PROMETHEUS_URL", "")
SWITCHYARD_PROMETHEUS_TIMEOUT_S = env_float("SWITCHYARD_PROMETHEUS_TIMEOUT_S", 2.0, minimum=0.1)
CELERY_BEAT_SCHEDULE["reconcile-rollouts"] = {
    "task": "rollouts.tasks.reconcile_rollouts",
    "schedule": timedelta(seconds=SWITCHYARD_ROLLOUT_INTERVAL_S),
    "options": {"expires": SWITCHYARD_ROLLOUT_INTERVAL_S},
}
# SLO status and burn-rate alerts (rollouts/slo/): every deployment evaluated this often.
SWITCHYARD_SLO_INTERVAL_S = env_float("SWITCHYARD_SLO_INTERVAL_S", 5.0, minimum=1.0)
CELERY_BEAT_SCHEDULE["evaluate-slos"] = {
    "task": "rollouts.tasks.evaluate_slos",
    "schedule": timedelta(seconds=SWITCHYARD_SLO_INTERVAL_S),
    "options": {"expires": SWITCHYARD_SLO_INTERVAL_S},
}
# Benchmark jobs (rollouts/benchmarks/): followed this often while their runner sweeps.
SWITCHYARD_BENCHMARK_INTERVAL_S = env_float("SWITCHYARD_BENCHMARK_INTERVAL_S", 1.0, minimum=0.2)
# A worker's claim on a benchmark job (rollouts/leases.py), renewed while its step runs.
SWITCHYARD_BENCHMARK_LEASE_S = env_float("SWITCHYARD_BENCHMARK_LEASE_S", 15.0, minimum=1.0)
# How long one benchmark request may wait for its answer before it counts as a timeout.
SWITCHYARD_BENCHMARK_REQUEST_TIMEOUT_S = env_float("SWITCHYARD_BENCHMARK_REQUEST_TIMEOUT_S", 30.0, minimum=1.0)
CELERY_BEAT_SCHEDULE["reconcile-benchmarks"] = {
    "task": "rollouts.tasks.reconcile_benchmarks",
    "schedule": timedelta(seconds=SWITCHYARD_BENCHMARK_INTERVAL_S),
    "options": {"expires": SWITCHYARD_BENCHMARK_INTERVAL_S},
}
CELERY_BEAT_SCHEDULE["ensure-routes"] = {
    "task": "rollouts.tasks.ensure_routes",
    "schedule": timedelta(seconds=SWITCHYARD_RECONCILE_INTERVAL_S),
    "options": {"expires": SWITCHYARD_RECONCILE_INTERVAL_S},
}

# --- REST API -------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "fleet.api.auth.APITokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    # Filters, ordering and pages that refuse what they cannot read (console/filters.py, console/pagination.py).
    "DEFAULT_FILTER_BACKENDS": [
        "console.filters.FilterBackend",
        "console.filters.OrderingFilter",
    ],
    "DEFAULT_PAGINATION_CLASS": "console.pagination.PageNumberPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "console.schema.AutoSchema",
    "EXCEPTION_HANDLER": "console.api.exception_handler",
    # Refuse deep nesting, NUL characters and out-of-range numbers with a 400 naming the field.
    "DEFAULT_PARSER_CLASSES": [
        "console.parsers.JSONParser",
        "console.parsers.FormParser",
        "console.parsers.MultiPartParser",
    ],
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Switchyard API",
    "DESCRIPTION": (
        "Model registry, fleet, quotas and audit for model serving on Triton and vLLM. "
        "Authenticate with `Authorization: Bearer <token>` (a tenant API token)."
    ),
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # OpenAPI 3.1: its schemas are JSON Schema, which can state what 3.0 cannot (the names a
    # map takes: label names are not empty).
    "OAS_VERSION": "3.1.0",
    # Request bodies are JSON (docs/api.md): form encodings, which the browsable API also
    # accepts, cannot state null, nested objects or lists, so the schema does not offer them.
    "PARSER_WHITELIST": ["rest_framework.parsers.JSONParser"],
    "SCHEMA_PATH_PREFIX": "/api/v1",
    # Served from this site: nothing outside the machine is reachable at run time.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Tags start collapsed (a click opens one) with a filter box: with every operation expanded
    # Swagger UI stops drawing partway down a schema of this size.
    "SWAGGER_UI_SETTINGS": {"docExpansion": "none", "filter": True, "deepLinking": True},
    # Choice sets that share a field name ("state") get names of their own.
    "ENUM_NAME_OVERRIDES": {
        "LoadStateEnum": "rollouts.models.loads.ModelLoad.State",
        "PlacementStateEnum": "fleet.models.quotas.Placement.State",
        "TokenStateEnum": ["active", "expired", "revoked"],
        "RolloutStateEnum": "rollouts.models.rollouts.Rollout.State",
        "WebhookDeliveryStateEnum": "fleet.models.webhooks.WebhookDelivery.State",
        "WebhookFormatEnum": "fleet.models.webhooks.Webhook.Format",
        "SloStatusEnum": "rollouts.models.slo.SloStatus.State",
        "SloAlertStateEnum": "rollouts.models.slo.SloAlert.State",
    },
    # Every operation states the errors it can answer, in one shape (console/schema.py).
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "console.schema.add_error_responses",
    ],
}

# --- Production hardening -------------------------------------------------------------------
# X-Forwarded-Proto and X-Forwarded-For are believed only when a proxy in front sets them and
# says so; otherwise any client could claim HTTPS, or another address.
SWITCHYARD_TRUST_PROXY_HEADERS = env_bool("SWITCHYARD_TRUST_PROXY_HEADERS", False)
if SWITCHYARD_TRUST_PROXY_HEADERS:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# Content-Security-Policy (django-csp): the console runs only its own, vendored scripts; no
# inline script or handler, and no eval (so no htmx trigger filters or hx-on: console.js does
# that work). Inline style attributes stay allowed (progress bars set widths; htmx adds its
# indicator style); they cannot run code. The API docs run under the same policy (Swagger UI's
# split view; ReDoc may also start its search worker from a blob: URL; console/urls.py).
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'", "'unsafe-inline'"],
        "img-src": ["'self'", "data:"],
        "connect-src": ["'self'"],
        "font-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    },
}

if PRODUCTION:
    SECURE_SSL_REDIRECT = env_bool("SWITCHYARD_SSL_REDIRECT", True)
    # Secure cookies need HTTPS; turn off only to try production mode over plain HTTP.
    SESSION_COOKIE_SECURE = env_bool("SWITCHYARD_SECURE_COOKIES", True)
    CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
    SECURE_HSTS_SECONDS = env_int("SWITCHYARD_HSTS_SECONDS", 31536000, minimum=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = env_bool("SWITCHYARD_HSTS_PRELOAD", False)
    SECURE_CONTENT_TYPE_NOSNIFF = True
    X_FRAME_OPTIONS = "DENY"
    if not env_bool("SWITCHYARD_HSTS_PRELOAD", False):
        SILENCED_SYSTEM_CHECKS = ["security.W021"]

# Plain text (the demo) or JSON lines (SWITCHYARD_LOG_FORMAT=json, as docker-compose runs it);
# either way every line names the request id it belongs to and what it is about (console.logs).
SWITCHYARD_LOG_FORMAT = env_str("SWITCHYARD_LOG_FORMAT", "plain")
if SWITCHYARD_LOG_FORMAT not in ("plain", "json"):
    raise ImproperlyConfigured(
        f"SWITCHYARD_LOG_FORMAT must be plain or json, got {SWITCHYARD_LOG_FORMAT!r}")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s%(context)s"},
        "json": {"()": "pythonjsonlogger.json.JsonFormatter",
                 "fmt": "%(asctime)s %(levelname)s %(name)s %(message)s",
                 "rename_fields": {"asctime": "time", "levelname": "level", "name": "logger"},
                 "json_default": str},
    },
    "filters": {"refusals_in_one_line": {"()": "console.logs.RefusalsInOneLine"},
                "with_context": {"()": "console.logs.WithContext"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": SWITCHYARD_LOG_FORMAT,
                             "filters": ["with_context"]}},
    "root": {"handlers": ["console"], "level": env_str("SWITCHYARD_LOG_LEVEL", "INFO")},
    "loggers": {
        # A 403 (or 400) is one line saying why; a 500 keeps its traceback.
        "django.request": {"filters": ["refusals_in_one_line"]},
        "django.db.backends": {"level": "WARNING"},
        "httpx": {"level": "WARNING"},  # one line per probe request is noise
    },
}

# --- Kubernetes clusters (fleet/inventory/kube_connection.py, fleet/inventory/kube_sync.py, rollouts/workloads/requests.py) --
# Stored cluster secrets (bearer tokens, kubeconfigs) are encrypted with a key derived from this
# (default: SECRET_KEY). Changing it makes them unreadable: they must be entered again.
SWITCHYARD_SECRET_KEY = env_secret("SWITCHYARD_SECRET_KEY")
# Every call to a cluster's API gives up after this long.
SWITCHYARD_KUBE_TIMEOUT_S = env_float("SWITCHYARD_KUBE_TIMEOUT_S", 10.0, minimum=1.0)
# A worker's claim on a server workload (rollouts/leases.py), renewed while its step runs. By
# default it covers a whole step: at most five API calls (six timeouts) and some slack.
SWITCHYARD_WORKLOAD_LEASE_S = env_float(
    "SWITCHYARD_WORKLOAD_LEASE_S", 6 * SWITCHYARD_KUBE_TIMEOUT_S + 10, minimum=1.0
)
# The only environment variables a cluster's kube_secret_env may name (comma-separated; empty:
# none): a cluster sends what it reads to its API server, so no other variable of this process
# (SECRET_KEY, DATABASE_URL, ...) may be read that way (fleet/inventory/secrets.py).
SWITCHYARD_KUBE_SECRET_ENV_ALLOWED = env_list("SWITCHYARD_KUBE_SECRET_ENV_ALLOWED", [])
# How often each Kubernetes cluster's nodes and servers are synced: a watch of at most this long
# from the last resourceVersion (a full list first, and again after a 410 Gone).
SWITCHYARD_KUBE_SYNC_INTERVAL_S = env_float("SWITCHYARD_KUBE_SYNC_INTERVAL_S", 15.0, minimum=1.0)
# A full list of the nodes at least this often, even while watches succeed (a watch that missed
# an event cannot tell), and the page size of lists (0: one request).
SWITCHYARD_KUBE_RELIST_INTERVAL_S = env_float(
    "SWITCHYARD_KUBE_RELIST_INTERVAL_S", 60.0, minimum=1.0
)
SWITCHYARD_KUBE_PAGE_SIZE = env_int("SWITCHYARD_KUBE_PAGE_SIZE", 500, minimum=0)
# How long new server pods may take to become available before the change is rolled back.
SWITCHYARD_KUBE_ROLLOUT_DEADLINE_S = env_float(
    "SWITCHYARD_KUBE_ROLLOUT_DEADLINE_S", 600.0, minimum=5.0
)
# An API server that has just started answers 403 to every call for a moment (its RBAC caches
# are not filled yet), exactly as it answers a real denial: a workload's calls refused (403) are
# tried again, backing off, and the refusal is taken as final only after this many seconds of
# them in a row (rollouts/workloads/reconciler.py). 0: at once.
SWITCHYARD_KUBE_FORBIDDEN_WINDOW_S = env_float(
    "SWITCHYARD_KUBE_FORBIDDEN_WINDOW_S", 30.0, minimum=0.0
)
SWITCHYARD_TRITON_IMAGE = env_str("SWITCHYARD_TRITON_IMAGE", "nvcr.io/nvidia/tritonserver:24.08-py3")
SWITCHYARD_VLLM_IMAGE = env_str("SWITCHYARD_VLLM_IMAGE", "vllm/vllm-openai:v0.6.3")
# The vLLM flags a version's vllm.args label may pass to a server Switchyard runs on Kubernetes:
# serving and memory knobs only. Flags that run code from the model repository
# (--trust-remote-code), read or write paths (--download-dir, --chat-template) or change what
# is served and where (--model, --port) are not in it.
SWITCHYARD_VLLM_ALLOWED_ARGS = env_list("SWITCHYARD_VLLM_ALLOWED_ARGS", [
    "--max-model-len", "--max-num-seqs", "--max-num-batched-tokens", "--gpu-memory-utilization",
    "--dtype", "--quantization", "--kv-cache-dtype", "--block-size", "--swap-space",
    "--enforce-eager", "--enable-prefix-caching", "--enable-chunked-prefill", "--seed",
    "--tensor-parallel-size", "--pipeline-parallel-size", "--enable-lora", "--max-lora-rank",
    "--max-loras", "--max-cpu-loras", "--disable-log-requests", "--disable-log-stats",
])
CELERY_BEAT_SCHEDULE["sync-kube-clusters"] = {
    "task": "fleet.tasks.sync_kube_clusters",
    "schedule": timedelta(seconds=SWITCHYARD_KUBE_SYNC_INTERVAL_S),
    "options": {"expires": SWITCHYARD_KUBE_SYNC_INTERVAL_S},
}
CELERY_BEAT_SCHEDULE["reconcile-workloads"] = {
    "task": "rollouts.tasks.reconcile_workloads",
    "schedule": timedelta(seconds=SWITCHYARD_RECONCILE_INTERVAL_S),
    "options": {"expires": SWITCHYARD_RECONCILE_INTERVAL_S},
}

# --- Switchyard's own /metrics (console/metrics.py) ------------------------------------------------
# Scrapers send "Authorization: Bearer <token>", loopback too; unset, /metrics answers 403 (its
# series name every tenant). SWITCHYARD_METRICS_ALLOW_NETS (comma-separated CIDRs) narrows further.
SWITCHYARD_METRICS_TOKEN = env_secret("SWITCHYARD_METRICS_TOKEN") or ""
SWITCHYARD_METRICS_ALLOW_NETS = env_list("SWITCHYARD_METRICS_ALLOW_NETS", [])
# The replica recommendation plans for this share of each replica's measured capacity.
SWITCHYARD_AUTOSCALE_TARGET_UTILIZATION = env_float(
    "SWITCHYARD_AUTOSCALE_TARGET_UTILIZATION", 0.7, minimum=0.05
)
