import json
import time
from pathlib import Path

from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = ("For `bench peers`: enqueues the work of a JSON file through a peer's own API, run "
            "with that peer's settings, and prints the time of its first enqueue.")

    def add_arguments(self, parser):
        parser.add_argument("peer", choices=["procrastinate", "tasks-db"])
        parser.add_argument("work_file")
        parser.add_argument("completions_file")

    def handle(self, *args, peer, work_file, completions_file, **options):
        # Imported here: each peer's module needs that peer's settings to be the ones in force.
        if peer == "procrastinate":
            from queues.bench.peer_procrastinate import enqueue
        else:
            from queues.bench.peer_tasks_db import enqueue
        work = json.loads(Path(work_file).read_text())
        started = time.time()
        enqueue(work, completions_file)
        self.stdout.write(json.dumps({"started": started, "tasks": len(work)}))
