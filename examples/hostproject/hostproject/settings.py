"""Settings of a small host project that installs QueueAdmin from its wheel.

Everything that differs between machines comes from the environment:

    HOST_DB_NAME (hostproject), HOST_DB_HOST (127.0.0.1), HOST_DB_PORT (5432),
    HOST_DB_USER (postgres), HOST_DB_PASSWORD (empty): a PostgreSQL database;
    HOST_SECRET_KEY (a development key), HOST_DEBUG (false),
    HOST_ALLOWED_HOSTS (localhost,127.0.0.1).

There is no QUEUEADMIN setting: the app's defaults (queues.conf) apply.
"""

import os
from pathlib import Path

from queues.conf import q_cluster

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("HOST_SECRET_KEY", "django-insecure-hostproject-development-only")
DEBUG = os.environ.get("HOST_DEBUG", "false").strip().lower() in ("1", "true", "yes", "on")
ALLOWED_HOSTS = [host.strip() for host in
                 os.environ.get("HOST_ALLOWED_HOSTS", "localhost,127.0.0.1").split(",")
                 if host.strip()]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_q",
    "django_htmx",
    "queues",
    "billing",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "hostproject.urls"
ASGI_APPLICATION = "hostproject.asgi.application"

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

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("HOST_DB_NAME", "hostproject"),
        "HOST": os.environ.get("HOST_DB_HOST", "127.0.0.1"),
        "PORT": int(os.environ.get("HOST_DB_PORT", "5432")),
        "USER": os.environ.get("HOST_DB_USER", "postgres"),
        "PASSWORD": os.environ.get("HOST_DB_PASSWORD", ""),
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# QueueAdmin's worker clusters: `manage.py qcluster`.
Q_CLUSTER = q_cluster(name="hostproject", workers=2)

# Django's tasks framework runs on QueueAdmin (billing/tasks.py): each task goes to the queue its
# queue_name names, created on first use, for the tenant of the enqueue's `tenant()` block.
TASKS = {
    "default": {
        "BACKEND": "queues.tasks_backend.QueueAdminBackend",
        "QUEUES": ["billing-tasks"],
    }
}

LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/ops/queues/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = BASE_DIR / "staticfiles"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "INFO"},
}
