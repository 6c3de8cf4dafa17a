"""Django settings for QueueAdmin; every environment-dependent value comes from config.load()."""

from datetime import timedelta

from queueadmin import config
from queues.conf import q_cluster

CONFIG = config.load()
BASE_DIR = config.BASE_DIR

QUEUEADMIN_ENV = CONFIG.env
DEBUG = CONFIG.debug
SECRET_KEY = CONFIG.secret_key
ALLOWED_HOSTS = CONFIG.allowed_hosts

INSTALLED_APPS = [
    # Django's admin site, open to the Admin role (queues.admin.QueueAdminSite).
    "queues.apps.QueueAdminSiteConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "csp",
    "django_q",
    "axes",
    # Two-factor login: TOTP authenticators and recovery codes. Before queues, whose admin
    # module replaces django-otp's device admins with an audited reset.
    "django_otp",
    "django_otp.plugins.otp_totp",
    "django_otp.plugins.otp_static",
    "queues",
    # Benchmarks, demo data and the demo producer: the standalone project's, not the app's.
    "queues.bench",
]

MIDDLEWARE = [
    # /healthz and /metrics, answered before host checks, the HTTPS redirect and sessions.
    "queues.ops.health.ProbeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "csp.middleware.CSPMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # Marks the user verified when this session has given a second factor (user.is_verified()).
    "django_otp.middleware.OTPMiddleware",
    "queues.web.middleware.UserTimeZoneMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Last, as django-axes asks: it turns a lockout signalled during login into its response.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "queueadmin.urls"
WSGI_APPLICATION = "queueadmin.wsgi.application"
ASGI_APPLICATION = "queueadmin.asgi.application"

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

DATABASES = {"default": CONFIG.database}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# The database cache is shared by every web and worker process without another service to run.
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.db.DatabaseCache",
        "LOCATION": "queueadmin_cache",
    }
}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# django-axes checks every password login first and refuses it while the username or the address
# is locked out; force_login (tests) bypasses backends and so is unaffected.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
# Five failures lock the username (from any address) and, separately, the address (for any
# username) for 15 minutes: a guesser spreading over users or over addresses is stopped either way.
AXES_FAILURE_LIMIT = 5
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]
AXES_COOLOFF_TIME = timedelta(minutes=15)
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
AXES_HTTP_RESPONSE_CODE = 429
AXES_CLIENT_IP_CALLABLE = "queues.web.security.client_ip"
AXES_SENSITIVE_PARAMETERS = ["password"]
# The issuer authenticator apps show beside the account name.
OTP_TOTP_ISSUER = "QueueAdmin"
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = BASE_DIR / "var" / "staticfiles"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": (
            "whitenoise.storage.CompressedManifestStaticFilesStorage"
            if CONFIG.is_production
            else "django.contrib.staticfiles.storage.StaticFilesStorage"
        )
    },
}

# Dashboard forms are small (the bulk form has about 20 fields); the field cap leaves room for a
# queue's account-policy inline in Django's admin site (six fields a row, about 160 rows). Larger
# or field-flooding posts are refused before parsing; nothing uploads files. The JSON API has its
# own, configurable limit (API_MAX_BODY_BYTES).
DATA_UPLOAD_MAX_MEMORY_SIZE = 2 * 1024 * 1024
DATA_UPLOAD_MAX_NUMBER_FIELDS = 1000
DATA_UPLOAD_MAX_NUMBER_FILES = 0

if CONFIG.is_production:
    # No SECURE_PROXY_SSL_HEADER: Django would take X-Forwarded-Proto from any client that
    # reaches the app directly. uvicorn --proxy-headers sets the request's scheme from it only
    # for a proxy in FORWARDED_ALLOW_IPS, and Django reads that scheme.
    SECURE_SSL_REDIRECT = True
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = 31536000
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Lax"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
# No inline scripts or styles anywhere: page JavaScript lives in static files and htmx is
# configured by a meta tag with its eval-based features off.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'", "data:"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    },
}

# django-q2 runs QueueAdmin's schedules and worker tasks, with the settings the app requires
# (queues.conf.q_cluster: QueueAdmin owns retries, so the broker never redelivers on its own).
Q_CLUSTER = q_cluster(
    # One worker of one cluster runs the selector loop; the others run batches.
    workers=CONFIG.workers,
    timeout=CONFIG.q_timeout_seconds,
)

# Django's tasks framework (django.tasks; the django-tasks backport on Django 5.2): `@task`
# functions enqueue as items of the queue their queue_name names, created on first use.
TASKS = {"default": {"BACKEND": "queues.tasks_backend.QueueAdminBackend", "QUEUES": []}}

QUEUEADMIN = {
    # Default stale threshold for new queues: a running item older than this is presumed lost.
    "STALE_THRESHOLD_SECONDS": CONFIG.stale_threshold_seconds,
    "TASK_TIMEOUT_SECONDS": CONFIG.q_timeout_seconds,
    # Default handler timeout of new queues: an attempt running longer is recorded as timed out.
    "HANDLER_TIMEOUT_SECONDS": CONFIG.handler_timeout_seconds,
    # On SIGTERM a cluster lets running handlers finish for this long, then records the rest as
    # retries with the reason "shutdown" (docker-compose's stop_grace_period stays above it).
    "SHUTDOWN_GRACE_SECONDS": CONFIG.shutdown_grace_seconds,
    # Hosts the webhook handler may reach although they resolve to private or local addresses.
    "WEBHOOK_ALLOWED_HOSTS": CONFIG.webhook_allowed_hosts,
    # JSON API limits: request body (413 above it), one item's payload, and how far ahead
    # run_at may be (a typo in a year should not park an item for a century).
    "API_MAX_BODY_BYTES": CONFIG.api_max_body_bytes,
    "API_MAX_PAYLOAD_BYTES": CONFIG.api_max_payload_bytes,
    "API_MAX_DELAY_DAYS": CONFIG.api_max_delay_days,
    # The most items one bulk retry or cancel may change.
    "BULK_MAX_ITEMS": CONFIG.bulk_max_items,
    # A live stream shows at most this many rows a second; past it, a count of the others.
    "STREAM_ROWS_PER_SECOND": CONFIG.stream_rows_per_second,
    # /metrics: a bearer token, or scrapers from these networks (ipaddress networks).
    "METRICS_TOKEN": CONFIG.metrics_token,
    "METRICS_ALLOWED_NETWORKS": CONFIG.metrics_allowed_networks,
    # Admins must enrol an authenticator before anything else (two-factor login).
    "REQUIRE_TWO_FACTOR_FOR_ADMINS": CONFIG.require_two_factor_for_admins,
    # Alert notices: e-mail recipients of every rule, a signed webhook, and how often a firing
    # alert nobody acknowledged is repeated (hours; 0 never).
    "ALERT_EMAILS": CONFIG.alert_emails,
    "ALERT_WEBHOOK_URL": CONFIG.alert_webhook_url,
    "ALERT_WEBHOOK_SECRET": CONFIG.alert_webhook_secret,
    "ALERT_REMINDER_HOURS": CONFIG.alert_reminder_hours,
}

# Django's mail settings (EMAIL_BACKEND, EMAIL_HOST, ... DEFAULT_FROM_EMAIL), which alert
# notices are sent with, from the environment variables of the same names.
globals().update(CONFIG.email)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"()": "queues.ops.logs.PlainFormatter",
                  "format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {"()": "queues.ops.logs.JsonFormatter"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": CONFIG.log_format}},
    "root": {"handlers": ["console"], "level": "INFO"},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        # django-q2 logs a line per enqueued task, i.e. per selector batch: noise at our rate.
        "django-q": {"level": "WARNING"},
        # django-axes logs every login at INFO; lockouts are warnings and still logged.
        "axes": {"level": "WARNING"},
    },
}
