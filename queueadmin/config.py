"""Reads QueueAdmin's configuration from the environment.

Every value is checked here, at start-up, so that a typo fails the process with a message naming
the variable instead of surfacing later as a confusing runtime error.
"""

import ipaddress
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import dj_database_url
from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.core.validators import validate_email

from queues.conf import MIN_START_WINDOW_SECONDS, MIN_TASK_TIMEOUT_SECONDS, normal_host

BASE_DIR = Path(__file__).resolve().parent.parent
ENVIRONMENTS = ("development", "production")
TRUE_WORDS = {"1", "true", "yes", "on"}
FALSE_WORDS = {"0", "false", "no", "off", ""}
# Process roles: the ASGI web process pools its PostgreSQL connections, every other process
# (workers, commands, tests) keeps one persistent connection per thread.
PROCESS_ROLES = ("web", "worker")
LOG_FORMATS = ("json", "plain")
# Scrapers on the same machine may read /metrics in development without a token.
DEVELOPMENT_METRICS_NETWORKS = "127.0.0.0/8,::1/128"
METRICS_TOKEN_MIN_LENGTH = 32
HOST_NAME = re.compile(r"^[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*$")


class ConfigError(ImproperlyConfigured):
    pass


@dataclass(frozen=True)
class Config:
    env: str
    debug: bool
    secret_key: str
    allowed_hosts: list[str]
    database: dict
    process_role: str
    stale_threshold_seconds: int
    q_timeout_seconds: int
    handler_timeout_seconds: int
    shutdown_grace_seconds: int
    workers: int
    webhook_allowed_hosts: list[str]
    api_max_body_bytes: int
    api_max_payload_bytes: int
    api_max_delay_days: int
    bulk_max_items: int
    stream_rows_per_second: int
    metrics_token: str
    metrics_allowed_networks: list
    log_format: str
    require_two_factor_for_admins: bool
    alert_emails: list[str]
    alert_webhook_url: str
    alert_webhook_secret: str
    alert_reminder_hours: int
    # Django's EMAIL_* settings (and DEFAULT_FROM_EMAIL), by setting name: how notices are sent.
    email: dict

    @property
    def is_production(self) -> bool:
        return self.env == "production"


# What .env.example writes where a secret goes: production refuses to start with it, since every
# reader of the repository knows it.
PLACEHOLDER = "change-me"


def parse_bool(name: str, raw: str) -> bool:
    word = raw.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ConfigError(f"{name}={raw!r} is not a boolean; use true or false.")


def parse_int(name: str, raw: str, *, minimum: int) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer.") from None
    if value < minimum:
        raise ConfigError(f"{name}={value} must be at least {minimum}.")
    return value


def is_ip_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def parse_hosts(name: str, raw: str) -> list[str]:
    hosts = []
    for entry in (part.strip() for part in raw.split(",")):
        if not entry:
            continue
        host = normal_host(entry)
        if not (is_ip_address(host) or HOST_NAME.match(host)):
            raise ConfigError(
                f"{name} entry {entry!r} is not a host name or IP address; list bare hosts "
                "separated by commas, e.g. hooks.internal,10.0.0.5"
            )
        hosts.append(host)
    return list(dict.fromkeys(hosts))


def parse_networks(name: str, raw: str) -> list:
    networks = []
    for entry in (part.strip() for part in raw.split(",")):
        if not entry:
            continue
        try:
            networks.append(ipaddress.ip_network(entry))
        except ValueError as exc:
            raise ConfigError(
                f"{name} entry {entry!r} is not a network: {exc}; list CIDRs separated by "
                "commas, e.g. 10.0.0.0/8,192.168.1.7/32"
            ) from None
    return networks


def parse_emails(name: str, raw: str) -> list[str]:
    addresses = [entry.strip() for entry in raw.split(",") if entry.strip()]
    for address in addresses:
        try:
            validate_email(address)
        except ValidationError:
            raise ConfigError(f"{name} entry {address!r} is not an e-mail address; list "
                              "addresses separated by commas.") from None
    return list(dict.fromkeys(addresses))


def email_settings(environ) -> dict:
    """Django's mail settings from the variables of the same names (Django's defaults when
    unset): SMTP by default, or e.g. the file-based backend with EMAIL_FILE_PATH."""
    settings = {
        "EMAIL_BACKEND": environ.get("EMAIL_BACKEND",
                                     "django.core.mail.backends.smtp.EmailBackend").strip(),
        "EMAIL_HOST": environ.get("EMAIL_HOST", "localhost").strip(),
        "EMAIL_PORT": parse_int("EMAIL_PORT", environ.get("EMAIL_PORT", "25"), minimum=1),
        "EMAIL_HOST_USER": environ.get("EMAIL_HOST_USER", ""),
        "EMAIL_HOST_PASSWORD": environ.get("EMAIL_HOST_PASSWORD", ""),
        "EMAIL_USE_TLS": parse_bool("EMAIL_USE_TLS", environ.get("EMAIL_USE_TLS", "false")),
        "DEFAULT_FROM_EMAIL": environ.get("DEFAULT_FROM_EMAIL", "webmaster@localhost").strip(),
    }
    if environ.get("EMAIL_FILE_PATH", "").strip():
        settings["EMAIL_FILE_PATH"] = environ["EMAIL_FILE_PATH"].strip()
    return settings


def database_settings(url: str, *, process_role: str, env: str) -> dict:
    scheme = urlsplit(url).scheme
    if scheme not in {"sqlite", "postgres", "postgresql", "pgsql"}:
        raise ConfigError(
            f"DATABASE_URL scheme {scheme!r} is not supported; use sqlite:///path or postgres://..."
        )
    try:
        db = dj_database_url.parse(url)
    except Exception as exc:  # dj-database-url raises several types for malformed URLs
        raise ConfigError(f"DATABASE_URL could not be parsed: {exc}") from None
    if db["ENGINE"] == "django.db.backends.sqlite3":
        return sqlite_settings(db)
    return postgres_settings(db, process_role=process_role, env=env)


def sqlite_settings(db: dict) -> dict:
    name = db["NAME"]
    if not name:
        raise ConfigError("DATABASE_URL for SQLite needs a file path, e.g. sqlite:///var/db.sqlite3")
    if name != ":memory:":
        Path(name).parent.mkdir(parents=True, exist_ok=True)
    # WAL lets readers (dashboard) run beside the single writer; IMMEDIATE takes the write lock at
    # BEGIN so two writers queue on the busy timeout instead of failing mid-transaction.
    db["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
        "init_command": (
            "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON; "
            "PRAGMA busy_timeout=20000;"
        ),
    }
    db["CONN_MAX_AGE"] = 0
    if name != ":memory:":
        # Tests get a file of their own, in WAL mode like production: Django's default in-memory
        # shared cache answers "table is locked" at once to a reader beside a writing thread.
        db["TEST"] = {"NAME": str(Path(name).with_name(f"test_{Path(name).name}"))}
    return db


def postgres_settings(db: dict, *, process_role: str, env: str) -> dict:
    if not db.get("NAME"):
        raise ConfigError("DATABASE_URL for PostgreSQL needs a database name.")
    if env == "production" and PLACEHOLDER in (db.get("PASSWORD") or "").lower():
        raise ConfigError(f"DATABASE_URL's password is .env.example's '{PLACEHOLDER}': set the "
                          "database's own (POSTGRES_PASSWORD, the same in both).")
    options = dict(db.get("OPTIONS") or {})
    options.setdefault("application_name", f"queueadmin-{process_role}")
    if process_role == "web":
        # Django advises against persistent connections under ASGI (each request may run on another
        # thread); psycopg's pool gives the same ~5 ms saving per request safely.
        # A short wait for a connection: when the database is down the API answers 503 at once
        # rather than holding the client (and a load balancer's health check) for long.
        options["pool"] = {"min_size": 2, "max_size": 20, "timeout": 3}
        db["CONN_MAX_AGE"] = 0
    else:
        db["CONN_MAX_AGE"] = None if env == "production" else 600
        db["CONN_HEALTH_CHECKS"] = True
    db["OPTIONS"] = options
    return db


def development_secret_key() -> str:
    # Web and workers must share the key (django-q2 signs pickled tasks with it), so development
    # keeps one generated key in var/ rather than a new one per process.
    path = BASE_DIR / "var" / "secret_key"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


def load(environ: os._Environ | dict | None = None) -> Config:
    environ = os.environ if environ is None else environ
    env = environ.get("QUEUEADMIN_ENV", "development").strip().lower()
    if env not in ENVIRONMENTS:
        raise ConfigError(f"QUEUEADMIN_ENV={env!r} must be one of: {', '.join(ENVIRONMENTS)}.")
    production = env == "production"

    process_role = environ.get("QUEUEADMIN_PROCESS", "worker").strip().lower()
    if process_role not in PROCESS_ROLES:
        raise ConfigError(
            f"QUEUEADMIN_PROCESS={process_role!r} must be one of: {', '.join(PROCESS_ROLES)}."
        )

    debug = parse_bool("DEBUG", environ.get("DEBUG", "false" if production else "true"))
    if production and debug:
        raise ConfigError("DEBUG=true is refused when QUEUEADMIN_ENV=production.")

    secret_key = environ.get("SECRET_KEY", "").strip()
    if production:
        # Django's own deploy check (W009) asks for the same: long, varied, not a template's.
        if (len(secret_key) < 50 or len(set(secret_key)) < 16
                or secret_key.startswith("django-insecure-")
                or PLACEHOLDER in secret_key.lower()):
            raise ConfigError(
                "SECRET_KEY is required in production: at least 50 random characters, 16 of "
                f"them distinct, not a 'django-insecure-' key nor .env.example's '{PLACEHOLDER}' "
                "(python -c 'import secrets; print(secrets.token_urlsafe(50))')."
            )
    elif not secret_key:
        secret_key = development_secret_key()

    hosts_raw = environ.get("ALLOWED_HOSTS", "" if production else "localhost,127.0.0.1,[::1]")
    allowed_hosts = [host.strip() for host in hosts_raw.split(",") if host.strip()]
    if production and "*" in allowed_hosts:
        raise ConfigError("ALLOWED_HOSTS=* is refused in production: list the site's host names.")
    if production and not allowed_hosts:
        raise ConfigError("ALLOWED_HOSTS is required in production (comma-separated host names).")

    default_db = f"sqlite:///{BASE_DIR / 'var' / 'queueadmin.sqlite3'}"
    database = database_settings(
        environ.get("DATABASE_URL", default_db).strip(), process_role=process_role, env=env
    )

    q_timeout = parse_int("QUEUEADMIN_TASK_TIMEOUT", environ.get("QUEUEADMIN_TASK_TIMEOUT", "300"),
                          minimum=MIN_TASK_TIMEOUT_SECONDS)
    default_stale = "7200" if production else "900"
    stale = parse_int(
        "QUEUEADMIN_STALE_THRESHOLD",
        environ.get("QUEUEADMIN_STALE_THRESHOLD", default_stale),
        minimum=60,
    )
    if stale <= q_timeout + 60:
        # A healthy attempt may run for the whole task timeout; rescuing it earlier runs it twice.
        raise ConfigError(
            f"QUEUEADMIN_STALE_THRESHOLD={stale}s must exceed QUEUEADMIN_TASK_TIMEOUT "
            f"({q_timeout}s) by more than 60s."
        )

    # A batch may start items only while an item started last could still end within the task
    # timeout; so the handler timeout must leave room for starting them.
    handler_timeout = parse_int(
        "QUEUEADMIN_HANDLER_TIMEOUT", environ.get("QUEUEADMIN_HANDLER_TIMEOUT", "180"), minimum=1)
    if handler_timeout > q_timeout - MIN_START_WINDOW_SECONDS:
        raise ConfigError(
            f"QUEUEADMIN_HANDLER_TIMEOUT={handler_timeout}s must be at most "
            f"QUEUEADMIN_TASK_TIMEOUT ({q_timeout}s) minus {MIN_START_WINDOW_SECONDS}s, the "
            f"least time a batch needs to start its items and record them."
        )
    shutdown_grace = parse_int(
        "QUEUEADMIN_SHUTDOWN_GRACE", environ.get("QUEUEADMIN_SHUTDOWN_GRACE", "30"), minimum=1)

    workers = parse_int("QUEUEADMIN_WORKERS", environ.get("QUEUEADMIN_WORKERS", "4"), minimum=2)

    webhook_allowed_hosts = parse_hosts(
        "QUEUEADMIN_WEBHOOK_ALLOWED_HOSTS", environ.get("QUEUEADMIN_WEBHOOK_ALLOWED_HOSTS", "")
    )

    api_max_body_bytes = parse_int(
        "QUEUEADMIN_API_MAX_BODY_BYTES",
        environ.get("QUEUEADMIN_API_MAX_BODY_BYTES", str(4 * 1024 * 1024)), minimum=1024,
    )
    api_max_payload_bytes = parse_int(
        "QUEUEADMIN_API_MAX_PAYLOAD_BYTES",
        environ.get("QUEUEADMIN_API_MAX_PAYLOAD_BYTES", str(64 * 1024)), minimum=64,
    )
    api_max_delay_days = parse_int(
        "QUEUEADMIN_API_MAX_DELAY_DAYS", environ.get("QUEUEADMIN_API_MAX_DELAY_DAYS", "90"),
        minimum=1,
    )

    bulk_max_items = parse_int(
        "QUEUEADMIN_BULK_MAX_ITEMS", environ.get("QUEUEADMIN_BULK_MAX_ITEMS", "500000"),
        minimum=1,
    )

    stream_rows_per_second = parse_int(
        "QUEUEADMIN_STREAM_ROWS_PER_SECOND",
        environ.get("QUEUEADMIN_STREAM_ROWS_PER_SECOND", "30"), minimum=1,
    )

    metrics_token = environ.get("QUEUEADMIN_METRICS_TOKEN", "").strip()
    if metrics_token and len(metrics_token) < METRICS_TOKEN_MIN_LENGTH:
        raise ConfigError(
            f"QUEUEADMIN_METRICS_TOKEN must be at least {METRICS_TOKEN_MIN_LENGTH} characters "
            "(python -c 'import secrets; print(secrets.token_urlsafe(32))')."
        )
    metrics_allowed_networks = parse_networks(
        "QUEUEADMIN_METRICS_ALLOWED_NETWORKS",
        environ.get("QUEUEADMIN_METRICS_ALLOWED_NETWORKS",
                    "" if production else DEVELOPMENT_METRICS_NETWORKS),
    )

    log_format = environ.get("QUEUEADMIN_LOG_FORMAT", "json" if production else "plain")
    log_format = log_format.strip().lower()
    if log_format not in LOG_FORMATS:
        raise ConfigError(
            f"QUEUEADMIN_LOG_FORMAT={log_format!r} must be one of: {', '.join(LOG_FORMATS)}."
        )

    # Production asks Admins, who can purge and manage users and tokens, for a second factor.
    require_two_factor_for_admins = parse_bool(
        "QUEUEADMIN_REQUIRE_TWO_FACTOR_FOR_ADMINS",
        environ.get("QUEUEADMIN_REQUIRE_TWO_FACTOR_FOR_ADMINS", "true" if production else "false"))

    alert_emails = parse_emails("QUEUEADMIN_ALERT_EMAILS",
                                environ.get("QUEUEADMIN_ALERT_EMAILS", ""))
    alert_webhook_url = environ.get("QUEUEADMIN_ALERT_WEBHOOK_URL", "").strip()
    if alert_webhook_url and urlsplit(alert_webhook_url).scheme not in ("http", "https"):
        raise ConfigError(f"QUEUEADMIN_ALERT_WEBHOOK_URL={alert_webhook_url!r} must be an "
                          "http or https URL.")
    alert_reminder_hours = parse_int(
        "QUEUEADMIN_ALERT_REMINDER_HOURS", environ.get("QUEUEADMIN_ALERT_REMINDER_HOURS", "4"),
        minimum=0)

    return Config(
        env=env,
        debug=debug,
        secret_key=secret_key,
        allowed_hosts=allowed_hosts,
        database=database,
        process_role=process_role,
        stale_threshold_seconds=stale,
        q_timeout_seconds=q_timeout,
        handler_timeout_seconds=handler_timeout,
        shutdown_grace_seconds=shutdown_grace,
        workers=workers,
        webhook_allowed_hosts=webhook_allowed_hosts,
        api_max_body_bytes=api_max_body_bytes,
        api_max_payload_bytes=api_max_payload_bytes,
        api_max_delay_days=api_max_delay_days,
        bulk_max_items=bulk_max_items,
        stream_rows_per_second=stream_rows_per_second,
        metrics_token=metrics_token,
        metrics_allowed_networks=metrics_allowed_networks,
        log_format=log_format,
        require_two_factor_for_admins=require_two_factor_for_admins,
        alert_emails=alert_emails,
        alert_webhook_url=alert_webhook_url,
        alert_webhook_secret=environ.get("QUEUEADMIN_ALERT_WEBHOOK_SECRET", "").strip(),
        alert_reminder_hours=alert_reminder_hours,
        email=email_settings(environ),
    )
