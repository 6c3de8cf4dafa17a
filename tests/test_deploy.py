"""Deployment: docker-compose.yml, the Dockerfile and .env.example checked without a Docker
engine (the file parses, names real commands, documents every setting), each service's command
run directly against PostgreSQL, the settings they read, and the JSON log lines."""

import json
import logging
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import requests
import yaml
from django.conf import settings
from django.core.management import get_commands

from queueadmin import config
from queueadmin.config import ConfigError
from queues.bench import processes
from queues.engine import sweeper, worker
from queues.engine.logfields import item_fields
from queues.models import ClusterHeartbeat, Item
from queues.ops.logs import JsonFormatter
from tests.factories import QueueFactory, items_in_status

ROOT = Path(settings.BASE_DIR)
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
# Set by docker-compose.yml per service, or refused in production: not for .env.
NOT_IN_ENV_FILE = {"QUEUEADMIN_PROCESS", "DEBUG"}
STRONG_KEY = "k" * 20 + "0123456789abcdefghijklmnopqrstuvwxyz"


def test_compose_has_the_database_a_one_shot_migration_web_and_scalable_workers():
    assert set(SERVICES) == {"db", "migrate", "web", "worker"}
    db = SERVICES["db"]
    assert db["image"].startswith("postgres:")
    assert "pg_isready" in " ".join(db["healthcheck"]["test"])
    volume = db["volumes"][0].split(":")[0]
    assert volume in COMPOSE["volumes"]
    assert SERVICES["migrate"]["restart"] == "no"
    assert SERVICES["migrate"]["depends_on"]["db"]["condition"] == "service_healthy"
    for name in ("web", "worker"):
        service = SERVICES[name]
        assert service["env_file"] == ".env"
        assert service["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
        assert "container_name" not in service  # --scale needs unnamed containers
    assert "/healthz" in " ".join(SERVICES["web"]["healthcheck"]["test"])
    assert "ports" not in SERVICES["worker"]


def test_docker_stop_leaves_a_worker_its_shutdown_grace_and_room_to_record():
    period = SERVICES["worker"]["stop_grace_period"]
    seconds = int(period[:-1]) * {"s": 1, "m": 60}[period[-1]]
    assert seconds >= config.load({}).shutdown_grace_seconds + 20


@pytest.mark.parametrize("name", ["migrate", "web", "worker"])
def test_each_service_command_names_a_real_program(name):
    command = SERVICES[name]["command"]
    if command[0] == "python":
        assert command[1] == "manage.py" and command[2] in get_commands()
    else:
        assert command[0] == "uvicorn"
        module, _, attribute = command[1].partition(":")
        assert hasattr(__import__(module, fromlist=[attribute]), attribute)


def test_the_database_gets_memory_for_pages_and_room_between_checkpoints():
    command = SERVICES["db"]["command"]
    settings = dict(word.split("=", 1) for word in command if "=" in word)
    assert command[0] == "postgres" and command.count("-c") == len(settings)
    assert settings["shared_buffers"] == "${POSTGRES_SHARED_BUFFERS:-1GB}"
    assert settings["max_wal_size"] == "${POSTGRES_MAX_WAL_SIZE:-8GB}"
    assert SERVICES["db"]["shm_size"] == "256mb"
    example = dict(line.split("=", 1) for line in (ROOT / ".env.example").read_text()
                   .splitlines() if line and not line.startswith("#"))
    assert example["POSTGRES_SHARED_BUFFERS"] == "1GB"
    assert example["POSTGRES_MAX_WAL_SIZE"] == "8GB"


def test_env_example_documents_every_setting_the_configuration_reads():
    read = set(re.findall(r'environ\.get\(\s*"([A-Z_]+)"', (ROOT / "queueadmin/config.py")
                          .read_text()))
    example = {line.split("=", 1)[0] for line in (ROOT / ".env.example").read_text().splitlines()
               if line and not line.startswith("#")}
    assert read - NOT_IN_ENV_FILE <= example
    values = dict(line.split("=", 1) for line in (ROOT / ".env.example").read_text().splitlines()
                  if line and not line.startswith("#"))
    assert values["QUEUEADMIN_ENV"] == "production"
    assert values["DATABASE_URL"].startswith("postgres://") and "@db:" in values["DATABASE_URL"]


def test_the_image_collects_static_files_with_production_settings(tmp_path):
    """WhiteNoise's manifest storage needs the manifest that only a production collectstatic
    writes; the Dockerfile's own command is run here (into a temporary directory)."""
    line = " ".join(part.strip().rstrip("\\") for part in (ROOT / "Dockerfile").read_text()
                    .split("RUN ")[2].splitlines()[:3])
    words = shlex.split(line)
    env = dict(word.split("=", 1) for word in words if re.match(r"^[A-Z_]+=", word))
    assert env["QUEUEADMIN_ENV"] == "production"
    assert words[-4:] == ["manage.py", "collectstatic", "--noinput", "-v0"]
    script = ("import django, os; os.environ['DJANGO_SETTINGS_MODULE'] = 'queueadmin.settings'; "
              "django.setup(); from django.conf import settings; "
              f"settings.STATIC_ROOT = {str(tmp_path)!r}; "
              "from django.core.management import call_command; "
              "call_command('collectstatic', interactive=False, verbosity=0)")
    subprocess.run([sys.executable, "-c", script], check=True, cwd=ROOT,  # noqa: S603
                   env={"PATH": "/usr/bin:/bin", **env,
                        "DATABASE_URL": f"sqlite:///{tmp_path}/build.sqlite3"})
    manifest = json.loads((tmp_path / "staticfiles.json").read_text())
    assert "queues/css/dashboard.css" in manifest["paths"]
    assert (tmp_path / (manifest["paths"]["queues/css/dashboard.css"] + ".gz")).exists()


# --- settings -----------------------------------------------------------------------------------

def load(**env):
    return config.load({k: v for k, v in env.items() if v is not None})


def test_metrics_and_log_format_defaults_differ_between_development_and_production():
    development = load()
    assert development.log_format == "plain"
    assert [str(n) for n in development.metrics_allowed_networks] == ["127.0.0.0/8", "::1/128"]
    production = load(QUEUEADMIN_ENV="production", SECRET_KEY=STRONG_KEY,
                      ALLOWED_HOSTS="q.example.com", DATABASE_URL="postgres://a@db/q")
    assert production.log_format == "json"
    assert production.metrics_allowed_networks == [] and production.metrics_token == ""


def test_metrics_networks_and_token_are_parsed():
    cfg = load(QUEUEADMIN_METRICS_ALLOWED_NETWORKS="10.0.0.0/8, 192.168.1.7/32",
               QUEUEADMIN_METRICS_TOKEN="t" * 32)
    assert [str(n) for n in cfg.metrics_allowed_networks] == ["10.0.0.0/8", "192.168.1.7/32"]
    assert cfg.metrics_token == "t" * 32


@pytest.mark.parametrize(("name", "value", "message"), [
    ("QUEUEADMIN_METRICS_ALLOWED_NETWORKS", "10.0.0.5/8", "QUEUEADMIN_METRICS_ALLOWED_NETWORKS"),
    ("QUEUEADMIN_METRICS_ALLOWED_NETWORKS", "intranet", "not a network"),
    ("QUEUEADMIN_METRICS_TOKEN", "short", "at least 32 characters"),
    ("QUEUEADMIN_LOG_FORMAT", "xml", "QUEUEADMIN_LOG_FORMAT='xml' must be one of"),
])
def test_bad_metrics_and_log_settings_are_refused_naming_the_variable(name, value, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load(**{name: value})


def test_a_bad_setting_stops_a_command_with_exit_status_2():
    proc = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT,  # noqa: S603
                          env={"PATH": "/usr/bin:/bin", "QUEUEADMIN_LOG_FORMAT": "xml"},
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "QUEUEADMIN_LOG_FORMAT" in proc.stderr


# --- JSON logs ----------------------------------------------------------------------------------

def record(message, *args, exc_info=None, **extra):
    rec = logging.LogRecord("queues.engine.worker", logging.WARNING, __file__, 1, message, args,
                            exc_info)
    rec.__dict__.update(extra)
    return rec


def test_a_json_log_line_carries_queue_item_and_account_as_fields():
    line = json.loads(JsonFormatter().format(record(
        "item %s failed", 7, **item_fields("emails", 7, "acme", attempt=2))))
    assert line["message"] == "item 7 failed"
    assert (line["queue"], line["item"], line["account"], line["attempt"]) == (
        "emails", 7, "acme", 2)
    assert line["level"] == "WARNING" and line["logger"] == "queues.engine.worker"
    assert line["time"].endswith("+00:00")


def test_a_json_log_line_keeps_the_exception_on_the_same_line():
    try:
        raise ValueError("boom")
    except ValueError:
        text = JsonFormatter().format(record("failed", exc_info=sys.exc_info()))
    assert "\n" not in text
    assert "ValueError: boom" in json.loads(text)["exception"]


@pytest.mark.django_db
def test_a_worker_logs_each_failed_attempt_with_its_queue_item_and_account(caplog):
    queue = QueueFactory(key="emails", handler="demo",
                         handler_options={"min_ms": 0, "max_ms": 0, "retry_rate": 1.0,
                                          "permanent_rate": 0})
    items = items_in_status(queue, "dispatched", 2, account="acme")
    with caplog.at_level(logging.WARNING, logger="queues.engine.worker"):
        worker.run_batch(queue.pk, [[item.pk, item.attempts] for item in items])
    lines = [r for r in caplog.records if r.name == "queues.engine.worker"]
    assert {(r.queue, r.item, r.account) for r in lines} == {
        ("emails", item.pk, "acme") for item in items}
    assert all("retry scheduled" in r.getMessage() for r in lines)


@pytest.mark.django_db
def test_the_sweeper_logs_each_lost_item_with_its_queue_item_and_account(caplog):
    from datetime import timedelta

    from django.utils import timezone

    queue = QueueFactory(key="emails")
    item = items_in_status(queue, "running", 1, account="acme")[0]
    Item.objects.filter(pk=item.pk).update(updated_at=timezone.now() - timedelta(days=1))
    with caplog.at_level(logging.WARNING, logger="queues.engine.sweeper"):
        sweeper.run(seconds=5)
    (line,) = [r for r in caplog.records
               if r.name == "queues.engine.sweeper" and "lost" in r.message]
    assert (line.queue, line.item, line.account) == ("emails", item.pk, "acme")


# --- the services' commands, run directly -------------------------------------------------------

@pytest.mark.postgres
@pytest.mark.parametrize(("proxies", "answer"), [("10.9.9.9", 301), ("127.0.0.1", 302)])
def test_only_a_listed_proxy_can_say_a_request_came_over_https(tmp_path, proxies, answer):
    """The web service's own command in production: X-Forwarded-Proto from a client that
    reaches it directly still gets the redirect to HTTPS; from a proxy in FORWARDED_ALLOW_IPS
    it is believed (then the page asks for a login)."""
    port = processes.free_port()
    web_args = SERVICES["web"]["command"][1:]
    web_args[web_args.index("--host") + 1] = "127.0.0.1"
    web_args[web_args.index("--port") + 1] = str(port)
    env = production_env() | SERVICES["web"]["environment"] | {"FORWARDED_ALLOW_IPS": proxies}
    with (tmp_path / "web.log").open("w") as log:
        web = processes.start(["-m", "uvicorn", *web_args], env, log)
        try:
            assert processes.wait_for(lambda: healthz(port) is not None, 30), \
                (tmp_path / "web.log").read_text()
            response = requests.get(f"http://127.0.0.1:{port}/", allow_redirects=False,
                                    headers={"Host": "queueadmin.example.com",
                                             "X-Forwarded-Proto": "https"}, timeout=10)
        finally:
            processes.stop([web])
    assert response.status_code == answer
    if answer == 301:
        assert response.headers["Location"].startswith("https://queueadmin.example.com/")
    else:
        assert "/accounts/login/" in response.headers["Location"]


def production_env() -> dict:
    return {"QUEUEADMIN_ENV": "production", "SECRET_KEY": STRONG_KEY,
            "ALLOWED_HOSTS": "queueadmin.example.com", "QUEUEADMIN_LOG_FORMAT": "json"}


def healthz(port: int):
    try:
        return requests.get(f"http://127.0.0.1:{port}/healthz", timeout=10)
    except requests.ConnectionError:
        return None


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_migrate_web_and_worker_commands_start_against_postgresql(tmp_path):
    env = production_env()
    migrate = SERVICES["migrate"]["command"]
    processes.run_manage(*migrate[2:], env=env)
    port = processes.free_port()
    web_args = SERVICES["web"]["command"][1:]
    web_args[web_args.index("--host") + 1] = "127.0.0.1"
    web_args[web_args.index("--port") + 1] = str(port)
    worker_command = SERVICES["worker"]["command"]
    started = []
    log = (tmp_path / "services.log").open("w")
    try:
        started.append(processes.start(
            ["-m", "uvicorn", *web_args], env | SERVICES["web"]["environment"], log))
        started.append(processes.start(
            [str(ROOT / worker_command[1]), *worker_command[2:]],
            env | SERVICES["worker"]["environment"], log))
        assert processes.wait_for(lambda: ClusterHeartbeat.objects.filter(
            pid=started[1].pid).exists(), 60), (tmp_path / "services.log").read_text()
        assert processes.wait_for(lambda: healthz(port) is not None, 30)
        response = healthz(port)
        assert response.status_code == 200
        assert response.json()["clusters"]["alive"] >= 1
    finally:
        processes.stop(started)
        log.close()
    lines = [line for line in (tmp_path / "services.log").read_text().splitlines()
             if line.startswith("{")]
    assert any(json.loads(line)["message"].endswith("heartbeat started") for line in lines)
