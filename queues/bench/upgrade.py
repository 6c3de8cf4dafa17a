"""`manage.py bench migrations`: how long the newest migrations take on this database (run it
on the 10M-item one): each is unapplied, newest first, then applied again one at a time, as an
upgrade applies it. A migration that rewrote a big table or scanned it under a lock would show
here as seconds or minutes. Unapplying a migration that created a table drops the table with
its rows: run this on a copy of a production database, never on the database itself."""

import threading
import time

from django.core.management import call_command
from django.db import connection, transaction
from django.db.migrations.loader import MigrationLoader

from queues.bench.scenarios import Report
from queues.models import Attempt, Item, ItemEvent

APP = "queues"


def newest_migrations(count: int) -> list[str]:
    loader = MigrationLoader(connection)
    names = sorted(name for app, name in loader.disk_migrations if app == APP)
    return names[-count:]


def run_migrations(*, count: int, log=print) -> Report:
    names = newest_migrations(count)
    report = Report("migrations", {"migrations": ", ".join(names), "items": Item.objects.count()})
    loader = MigrationLoader(connection)
    applied = {name for app, name in loader.applied_migrations if app == APP}
    missing = [name for name in names if name not in applied]
    if missing:
        raise RuntimeError(f"apply every migration first (`migrate`); not applied: {missing}")
    every = sorted(name for app, name in loader.disk_migrations if app == APP)
    before = every[every.index(names[0]) - 1]
    # Backwards, newest first: the way a rollback of this release would go.
    for index in range(len(names) - 1, -1, -1):
        target = names[index - 1] if index else before
        seconds = _timed_migrate(target)
        log(f"unapplied {names[index]} in {seconds:.2f} s")
        report.add(f"{names[index]} backwards", seconds, "s")
    for name in names:
        with _WriteProbe() as probe:
            seconds = _timed_migrate(name)
        log(f"applied {name} in {seconds:.2f} s; a write waited at most {probe.longest:.0f} ms")
        report.add(f"{name} forwards", seconds, "s")
        report.add(f"{name} forwards: longest wait of a write", probe.longest, "ms")
    report.notes.append("Forwards is what an upgrade runs; every one of them must be safe while "
                        "the previous release keeps running (docs/deploy.md).")
    return report


class _WriteProbe:
    """While a migration runs, another connection takes the lock every write to the items,
    events and attempts tables takes (ROW EXCLUSIVE) every 20 ms and keeps the longest wait: a
    migration that locks any of them for long shows here, whatever it did under the lock."""

    def __init__(self):
        self.longest = 0.0
        self.done = threading.Event()

    def _run(self):
        tables = ", ".join(model._meta.db_table for model in (Item, ItemEvent, Attempt))
        try:
            while not self.done.is_set():
                started = time.perf_counter()
                with transaction.atomic(), connection.cursor() as cursor:
                    cursor.execute(f"LOCK TABLE {tables} IN ROW EXCLUSIVE MODE")
                self.longest = max(self.longest, (time.perf_counter() - started) * 1000)
                self.done.wait(0.02)
        finally:
            connection.close()

    def __enter__(self):
        self.thread = threading.Thread(target=self._run, name="write-probe")
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()


def _timed_migrate(target: str) -> float:
    started = time.perf_counter()
    call_command("migrate", APP, target, verbosity=0, interactive=False)
    return time.perf_counter() - started
