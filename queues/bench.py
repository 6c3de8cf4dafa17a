"""`manage.py bench`: scenarios that measure QueueAdmin at scale and report figures.

Each scenario returns a Report; the command prints it as a table and writes it as JSON under
var/bench/ so docs/benchmarks.md can quote the latest figures.
"""

import json
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from django.conf import settings
from django.db import connection
from django.utils import timezone

from queues import lifecycle, seeding
from queues.models import Queue

RESULTS_DIR = settings.BASE_DIR / "var" / "bench"


@dataclass
class Report:
    scenario: str
    parameters: dict
    figures: list[tuple[str, float, str]] = field(default_factory=list)

    def add(self, name: str, value: float, unit: str):
        self.figures.append((name, round(value, 3), unit))

    def as_table(self) -> str:
        width = max(len(name) for name, _, _ in self.figures) if self.figures else 10
        lines = [f"bench {self.scenario} ({connection.vendor}; "
                 + ", ".join(f"{k}={v}" for k, v in self.parameters.items()) + ")"]
        lines += [f"  {name:<{width}}  {value:>14,.3f}  {unit}" for name, value, unit in
                  self.figures]
        return "\n".join(lines)

    def write_json(self, directory: Path | None = None) -> Path:
        directory = directory or RESULTS_DIR
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{self.scenario}.json"
        data = asdict(self) | {
            "database": connection.vendor,
            "measured_at": timezone.now().isoformat(),
            "machine": {"python": platform.python_version(), "platform": platform.platform()},
        }
        path.write_text(json.dumps(data, indent=2))
        return path


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def bench_queue(key: str, **settings_) -> Queue:
    queue, _ = Queue.objects.update_or_create(
        key=key, defaults={"name": key.replace("-", " ").title(), **settings_}
    )
    return queue


def run_seed(*, items: int, accounts: int, queues: int, log=print) -> Report:
    targets = [bench_queue(f"bench-{i}") for i in range(queues)]
    result = seeding.seed(items=items, accounts=accounts, queues=targets, log=log)
    report = Report("seed", {"items": items, "accounts": accounts, "queues": queues})
    for name, seconds in result.seconds.items():
        report.add(f"{name} time", seconds, "s")
    report.add("total time (wall clock)", result.wall_seconds, "s")
    report.add("items per second", items / result.wall_seconds, "items/s")
    for name, rows in result.rows.items():
        report.add(f"{name} rows", rows, "rows")
    return report


def run_enqueue(*, items: int, batch: int, accounts: int) -> Report:
    """Items per second through enqueue_many, batch by batch, as producers call it."""
    queue = bench_queue("bench-enqueue")
    run = f"e{int(time.time() * 1000):x}"
    latencies = []
    started = time.perf_counter()
    for offset in range(0, items, batch):
        rows = [
            {"account": f"acct-{(n * 7919) % accounts:05d}", "identifier": f"{run}-{n}",
             "payload": {"order": n, "amount_cents": n % 100000}}
            for n in range(offset, min(items, offset + batch))
        ]
        t0 = time.perf_counter()
        lifecycle.enqueue_many(queue.key, rows, actor="bench")
        latencies.append(time.perf_counter() - t0)
    elapsed = time.perf_counter() - started
    report = Report("enqueue", {"items": items, "batch": batch, "accounts": accounts})
    report.add("throughput", items / elapsed, "items/s")
    report.add("batch latency p50", statistics.median(latencies) * 1000, "ms")
    report.add("batch latency p95", percentile(latencies, 0.95) * 1000, "ms")
    report.add("total time", elapsed, "s")
    return report
