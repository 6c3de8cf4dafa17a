"""The web entry points set the process up once before serving."""

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize("entry_point", ["queueadmin.asgi", "queueadmin.wsgi"])
def test_the_web_process_hides_what_lives_forever_from_the_garbage_collector(entry_point,
                                                                               tmp_path):
    code = (f"import gc, sys, {entry_point}; "
            "print(gc.get_freeze_count(), 'queues.web.pages' in sys.modules)")
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}"}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,  # noqa: S603
                            text=True, timeout=60, check=True)
    frozen, views_loaded = result.stdout.split()
    # Django and the apps alone are tens of thousands of objects; the views are among them,
    # imported before the freeze rather than by the first request.
    assert int(frozen) > 20_000
    assert views_loaded == "True"


@pytest.mark.parametrize(("command", "frozen"), [("qcluster", True), ("check", False)])
def test_a_worker_cluster_alone_among_commands_freezes_at_start_up(command, frozen, tmp_path):
    code = ("import gc, sys; sys.argv = ['manage.py', sys.argv[1]]; import django; "
            "django.setup(); print(gc.get_freeze_count())")
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
           "DJANGO_SETTINGS_MODULE": "queueadmin.settings"}
    result = subprocess.run([sys.executable, "-c", code, command], env=env,  # noqa: S603
                            capture_output=True, text=True, timeout=60, check=True)
    assert (int(result.stdout) > 20_000) is frozen
