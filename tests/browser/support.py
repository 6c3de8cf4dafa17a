"""What the browser tests share: Debian's Chromium, a database of the server's own (an SQLite
file, or a fresh PostgreSQL database beside the test database), commands run on it in child
processes, and signing in through the login form."""

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from django.conf import settings
from django.db import connection

from queues.bench import processes
from tests.browser.seed import PASSWORD

AXE_DIR = settings.BASE_DIR / "var" / "axe"
AXE = AXE_DIR / "node_modules" / "axe-core" / "axe.min.js"
ARTIFACTS = settings.BASE_DIR / "var" / "test-artifacts" / "browser"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


def playwright_or_skip():
    """Playwright's sync API for a browser test module, which is skipped when Debian's
    Chromium is not installed (CI installs it; playwright never downloads its own)."""
    import pytest

    if not Path(CHROMIUM).exists():
        pytest.skip("Debian chromium is not installed (apt-get install chromium)",
                    allow_module_level=True)
    return pytest.importorskip("playwright.sync_api")


class ServerDatabase:
    """A database for server child processes; `drop()` removes it (PostgreSQL)."""

    def __init__(self, tmp: Path, label: str):
        self.name = None
        if connection.vendor != "postgresql":
            self.url = f"sqlite:///{tmp / f'{label}.sqlite3'}"
            return
        self.name = f"{connection.settings_dict['NAME']}_{label}_{uuid.uuid4().hex[:6]}"
        with self._admin() as admin:
            admin.execute(f'CREATE DATABASE "{self.name}"')
        self.url = urlunsplit(urlsplit(processes.database_url())._replace(path=f"/{self.name}"))

    def _admin(self):
        import psycopg

        db = connection.settings_dict
        return psycopg.connect(host=db["HOST"], port=db["PORT"] or 5432, user=db["USER"],
                               password=db["PASSWORD"] or None, dbname="postgres",
                               autocommit=True)

    def env(self) -> dict:
        return {"DATABASE_URL": self.url, "QUEUEADMIN_ENV": "development", "DEBUG": "true",
                "DJANGO_SETTINGS_MODULE": "queueadmin.settings"}

    def drop(self):
        if self.name:
            with self._admin() as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


def run(env: dict, *args: str) -> str:
    """Our own interpreter with fixed arguments, on the server's database."""
    return subprocess.run([sys.executable, *args], env=os.environ | env, check=True,  # noqa: S603
                          cwd=settings.BASE_DIR, capture_output=True, text=True).stdout.strip()


def migrate_and_seed(env: dict, seed: str = "seed"):
    """Migrate the server's database, then run a seed function of tests.browser.seed in it."""
    run(env, "manage.py", "migrate", "--noinput", "-v0")
    run(env, "-c", f"import django; django.setup(); from tests.browser import seed; seed.{seed}()")


def sign_in(page, server_url: str, username: str):
    page.goto(f"{server_url}/accounts/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{server_url}/")


def axe_source() -> str:
    """axe-core from the npm registry, installed under var/axe on first use."""
    if not AXE.exists() and shutil.which("npm"):
        AXE_DIR.mkdir(parents=True, exist_ok=True)
        subprocess.run(["npm", "install", "--no-audit", "--no-fund", "axe-core@4"],  # noqa: S607
                       cwd=AXE_DIR, check=True, capture_output=True)
    assert AXE.exists(), "axe-core is missing: npm install --prefix var/axe axe-core@4"
    return AXE.read_text()


def artifact(name: str) -> Path:
    """Where a screenshot called `name` goes (one per database vendor)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS / f"{name}-{connection.vendor}.png"


def check_accessibility(page, axe: str, name: str):
    """axe-core in the page (through the DevTools protocol, which the CSP does not block);
    serious and critical violations fail the test. Saves a screenshot as an artifact."""
    page.screenshot(path=artifact(name), full_page=True)
    page.evaluate(axe)
    result = page.evaluate("axe.run(document, {resultTypes: ['violations']})")
    bad = [(v["id"], v["impact"], [n["target"] for n in v["nodes"]][:3])
           for v in result["violations"] if v["impact"] in ("serious", "critical")]
    assert not bad, f"{name}: {bad}"
