import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from queueadmin import config
from queueadmin.config import ConfigError

STRONG_KEY = "k" * 20 + "0123456789abcdefghijklmnopqrstuvwxyz"
PRODUCTION = {
    "QUEUEADMIN_ENV": "production",
    "SECRET_KEY": STRONG_KEY,
    "ALLOWED_HOSTS": "queues.example.com",
    "DATABASE_URL": "postgres://app@db.internal:5432/queueadmin",
}


def load(**env):
    return config.load({k: v for k, v in env.items() if v is not None})


def test_development_is_the_default_with_debug_and_a_sqlite_file():
    cfg = load()
    assert cfg.env == "development"
    assert cfg.debug is True
    assert cfg.database["ENGINE"] == "django.db.backends.sqlite3"
    assert cfg.database["NAME"].endswith("var/queueadmin.sqlite3")


def test_sqlite_uses_wal_immediate_transactions_and_a_busy_timeout():
    db = load().database
    assert db["OPTIONS"]["transaction_mode"] == "IMMEDIATE"
    assert "journal_mode=WAL" in db["OPTIONS"]["init_command"]
    assert db["OPTIONS"]["timeout"] >= 5


def test_development_keeps_one_secret_key_for_every_process():
    assert load().secret_key == load().secret_key


def test_production_requires_a_strong_secret_key():
    with pytest.raises(ConfigError, match="SECRET_KEY is required"):
        load(**(PRODUCTION | {"SECRET_KEY": None}))
    with pytest.raises(ConfigError, match="SECRET_KEY"):
        load(**(PRODUCTION | {"SECRET_KEY": "short"}))
    for weak in ("ab" * 30, "django-insecure-" + STRONG_KEY):
        with pytest.raises(ConfigError, match="SECRET_KEY"):
            load(**(PRODUCTION | {"SECRET_KEY": weak}))


def test_production_refuses_the_placeholders_of_env_example():
    example = dict(line.split("=", 1) for line in (config.BASE_DIR / ".env.example").read_text()
                   .splitlines() if line and not line.startswith("#"))
    with pytest.raises(ConfigError, match="change-me"):
        load(**(PRODUCTION | {"SECRET_KEY": example["SECRET_KEY"]}))
    with pytest.raises(ConfigError, match="password"):
        load(**(PRODUCTION | {"DATABASE_URL": example["DATABASE_URL"]}))


def test_production_refuses_any_host():
    with pytest.raises(ConfigError, match="ALLOWED_HOSTS=\\* is refused"):
        load(**(PRODUCTION | {"ALLOWED_HOSTS": "queues.example.com,*"}))


def test_production_requires_allowed_hosts():
    with pytest.raises(ConfigError, match="ALLOWED_HOSTS"):
        load(**(PRODUCTION | {"ALLOWED_HOSTS": None}))


def test_production_refuses_debug():
    with pytest.raises(ConfigError, match="DEBUG=true is refused"):
        load(**(PRODUCTION | {"DEBUG": "true"}))


def test_production_settings_load_when_complete():
    cfg = load(**PRODUCTION)
    assert cfg.is_production and cfg.debug is False
    assert cfg.allowed_hosts == ["queues.example.com"]
    assert cfg.stale_threshold_seconds == 7200


def test_admins_need_a_second_factor_in_production_unless_turned_off():
    assert load(**PRODUCTION).require_two_factor_for_admins is True
    assert load(**PRODUCTION, QUEUEADMIN_REQUIRE_TWO_FACTOR_FOR_ADMINS="false"
                ).require_two_factor_for_admins is False
    assert load().require_two_factor_for_admins is False


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"QUEUEADMIN_ENV": "staging"}, "QUEUEADMIN_ENV='staging' must be one of"),
        ({"DEBUG": "maybe"}, "DEBUG='maybe' is not a boolean"),
        ({"DATABASE_URL": "mysql://u@h/db"}, "scheme 'mysql' is not supported"),
        ({"DATABASE_URL": "postgres://u@h:5432/"}, "needs a database name"),
        ({"QUEUEADMIN_PROCESS": "cron"}, "QUEUEADMIN_PROCESS='cron'"),
        ({"QUEUEADMIN_TASK_TIMEOUT": "ten"}, "is not an integer"),
        # The selector loop runs until the next minute's tick: refused at start, not only by
        # `manage.py check`.
        ({"QUEUEADMIN_TASK_TIMEOUT": "100", "QUEUEADMIN_HANDLER_TIMEOUT": "60"},
         "QUEUEADMIN_TASK_TIMEOUT=100 must be at least 120"),
        ({"QUEUEADMIN_STALE_THRESHOLD": "300"}, "must exceed QUEUEADMIN_TASK_TIMEOUT"),
        ({"QUEUEADMIN_WORKERS": "1"}, "QUEUEADMIN_WORKERS=1 must be at least 2"),
        ({"QUEUEADMIN_HANDLER_TIMEOUT": "290"}, "QUEUEADMIN_HANDLER_TIMEOUT=290s must be at most"),
        ({"QUEUEADMIN_SHUTDOWN_GRACE": "0"}, "QUEUEADMIN_SHUTDOWN_GRACE=0 must be at least 1"),
        ({"QUEUEADMIN_API_MAX_BODY_BYTES": "1mb"}, "QUEUEADMIN_API_MAX_BODY_BYTES='1mb'"),
        ({"QUEUEADMIN_API_MAX_PAYLOAD_BYTES": "10"}, "must be at least 64"),
        ({"QUEUEADMIN_API_MAX_DELAY_DAYS": "0"}, "QUEUEADMIN_API_MAX_DELAY_DAYS=0 must be"),
        ({"QUEUEADMIN_STREAM_ROWS_PER_SECOND": "0"},
         "QUEUEADMIN_STREAM_ROWS_PER_SECOND=0 must be at least 1"),
        ({"QUEUEADMIN_REQUIRE_TWO_FACTOR_FOR_ADMINS": "sometimes"},
         "QUEUEADMIN_REQUIRE_TWO_FACTOR_FOR_ADMINS='sometimes' is not a boolean"),
    ],
)
def test_it_refuses_bad_values_naming_the_variable(env, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        load(**env)


def test_the_stream_row_cap_comes_from_the_environment():
    assert load().stream_rows_per_second == 30
    assert load(QUEUEADMIN_STREAM_ROWS_PER_SECOND="5").stream_rows_per_second == 5


def test_postgres_workers_keep_persistent_connections():
    db = load(DATABASE_URL="postgres://u@h:5432/q", QUEUEADMIN_PROCESS="worker").database
    assert db["CONN_MAX_AGE"] == 600
    assert db["CONN_HEALTH_CHECKS"] is True
    assert "pool" not in db["OPTIONS"]


def test_postgres_web_process_uses_the_psycopg_pool_not_persistent_connections():
    db = load(DATABASE_URL="postgres://u@h:5432/q", QUEUEADMIN_PROCESS="web").database
    assert db["CONN_MAX_AGE"] == 0
    assert db["OPTIONS"]["pool"]["max_size"] >= db["OPTIONS"]["pool"]["min_size"]


def test_a_bad_setting_stops_manage_py_with_one_clear_line():
    env = {k: v for k, v in os.environ.items() if k != "SECRET_KEY"}
    env |= {"QUEUEADMIN_ENV": "production", "ALLOWED_HOSTS": "x.example.com",
            "DJANGO_SETTINGS_MODULE": "queueadmin.settings"}
    proc = subprocess.run([sys.executable, "manage.py", "check"], env=env,
                          capture_output=True, text=True, cwd=config.BASE_DIR, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith("Configuration error: SECRET_KEY is required in production")
    assert "Traceback" not in proc.stderr


def test_a_bad_setting_stops_the_web_process_with_one_clear_line():
    """uvicorn imports queueadmin.asgi: the same mistake is one line there too."""
    env = {k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "DJANGO_SETTINGS_MODULE")}
    env |= {"QUEUEADMIN_ENV": "production", "ALLOWED_HOSTS": "x.example.com"}
    proc = subprocess.run([sys.executable, "-c", "import queueadmin.asgi"], env=env,
                          capture_output=True, text=True, cwd=config.BASE_DIR, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith("Configuration error: SECRET_KEY is required in production")
    assert "Traceback" not in proc.stderr


def test_the_readme_and_env_example_name_every_variable_the_settings_read():
    """A variable the configuration table leaves out is one an operator never hears of."""
    root = Path(config.__file__).resolve().parent.parent
    source = Path(config.__file__).read_text()
    read = set(re.findall(r'"((?:QUEUEADMIN|EMAIL)_[A-Z_]+|DATABASE_URL|SECRET_KEY|'
                          r'ALLOWED_HOSTS|DEBUG|DEFAULT_FROM_EMAIL)"', source))
    assert len(read) > 25
    table = (root / "README.md").read_text().split("## Configuration", 1)[1]
    assert {name for name in read if f"`{name}`" not in table} == set()
    compose = (root / "docker-compose.yml").read_text()
    for name in set(re.findall(r"\$\{([A-Z_]+)", compose)):
        assert f"`{name}`" in table
