from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connection

from queues.bench import operators as bench_operators
from queues.bench import peers as bench_peers
from queues.bench import retention as bench_retention
from queues.bench import scenarios as bench
from queues.bench import soak as bench_soak
from queues.bench import upgrade as bench_upgrade
from queues.bench import workload as bench_workload


class Command(BaseCommand):
    help = ("Measure QueueAdmin at scale. Scenarios: seed, enqueue, selector, planner, "
            "throughput, workload, peers, bulk, api, stream, pages, retention, soak, migrations, "
            "operators.")

    def add_arguments(self, parser):
        scenarios = parser.add_subparsers(dest="scenario", required=True)
        seed = scenarios.add_parser("seed", help="Fill the database with realistic queue data.")
        seed.add_argument("--items", type=int, default=1_000_000)
        seed.add_argument("--accounts", type=int, default=10_000)
        seed.add_argument("--queues", type=int, default=1)
        enqueue = scenarios.add_parser("enqueue", help="Items/s through enqueue_many.")
        enqueue.add_argument("--items", type=int, default=100_000)
        enqueue.add_argument("--batch", type=int, default=1000)
        enqueue.add_argument("--accounts", type=int, default=1000)
        select = scenarios.add_parser(
            "selector", help="Round latency and fairness (against the seed's algorithm).")
        select.add_argument("--dataset", action="append", choices=list(bench.SELECTOR_DATASETS),
                            help="repeat to pick several (default: all, unless --queue)")
        select.add_argument("--queue", action="append", default=[],
                            help="time an already seeded queue instead (repeatable), e.g. "
                                 "bench-0 after bench seed --items 10000000; its batch is 60 "
                                 "and its concurrency and rate limits are lifted while it "
                                 "is timed, then put back")
        select.add_argument("--rounds", type=int, default=200)
        select.add_argument("--working-clusters", type=int, default=0,
                            help="instead of timing rounds here, let this many clusters work "
                                 "through the queue's backlog (every other queue paused) and "
                                 "report the rounds their selector ran")
        select.add_argument("--working-seconds", type=float, default=60)
        select.add_argument("--fairness-rounds", type=int, default=500)
        planner = scenarios.add_parser(
            "planner", help="plan_batch alone on 10k and 100k backlogged accounts (p50/p95).")
        planner.add_argument("--accounts", type=int, action="append",
                             help="repeat to pick several (default: 10000 and 100000)")
        planner.add_argument("--batch", type=int, default=60)
        planner.add_argument("--runs", type=int, default=50, help="timed plans per case")
        throughput = scenarios.add_parser(
            "throughput", help="Items/s end to end with real worker clusters (noop handler).")
        throughput.add_argument("--items", type=int, default=50_000)
        throughput.add_argument("--accounts", type=int, default=1000)
        throughput.add_argument("--clusters", type=int, default=2)
        throughput.add_argument("--bare-items", type=int, default=2000)
        throughput.add_argument("--timeout", type=float, default=600)
        workload = scenarios.add_parser(
            "workload", help="Realistic work at default settings: latency, throughput, kill -9, "
                             "against bare django-q2.")
        workload.add_argument("--items", type=int, default=5000)
        workload.add_argument("--clusters", type=int, default=2)
        workload.add_argument("--accounts", type=int, default=50)
        workload.add_argument("--trickle-seconds", type=float, default=150,
                              help="how long an idle queue is fed one item every 0.25 s")
        workload.add_argument("--drain-timeout", type=float, default=480,
                              help="seconds the kill drill may take to end every item")
        workload.add_argument("--runs", type=int, default=3,
                              help="interleaved runs of the default and the uncapped queue")
        peers = scenarios.add_parser(
            "peers", help="No-op and realistic work through QueueAdmin, bare django-q2, "
                          "procrastinate and django-tasks-db, interleaved (PostgreSQL).")
        peers.add_argument("--items", type=int, default=5000, help="tasks per measurement")
        peers.add_argument("--clusters", type=int, default=2,
                           help="django-q2 clusters; the peers get as many worker processes")
        peers.add_argument("--runs", type=int, default=3)
        peers.add_argument("--accounts", type=int, default=50)
        peers.add_argument("--system", action="append", choices=list(bench_peers.SYSTEMS),
                           help="repeat to pick several (default: all)")
        peers.add_argument("--finished-share", type=float, default=bench_workload.FINISHED_SHARE,
                           help="share of tasks whose end stops the clock (the realistic work's "
                                "few 155-170 s tasks would otherwise only measure themselves)")
        bulk = scenarios.add_parser(
            "bulk", help="Bulk retry and cancel of 100k items while the selector runs.")
        bulk.add_argument("--items", type=int, default=100_000)
        bulk.add_argument("--selector-rounds", type=int, default=100)
        bulk.add_argument("--selector-queue", default=bench.BULK_SELECTOR_QUEUE,
                          help="the queue whose rounds are timed meanwhile: a data set's, "
                               "or one `bench seed` filled")
        api = scenarios.add_parser(
            "api", help="Items/s accepted through the JSON API over real HTTP.")
        api.add_argument("--items", type=int, default=100_000, help="items sent in batches")
        api.add_argument("--single-items", type=int, default=5_000)
        api.add_argument("--clients", type=int, default=4)
        api.add_argument("--server-workers", type=int, default=2)
        live = scenarios.add_parser(
            "stream", help="Commit-to-browser latency of the live stream over real SSE.")
        live.add_argument("--events", type=int, default=1000)
        live.add_argument("--clients", type=int, default=20)
        live.add_argument("--rate", type=float, default=200, help="transitions per second")
        live.add_argument("--idle-seconds", type=float, default=10)
        pages = scenarios.add_parser(
            "pages", help="Server time and SQL queries of the dashboard pages (seed first).")
        pages.add_argument("--queue", default="bench-0", help="a seeded queue")
        pages.add_argument("--requests", type=int, default=50, help="timed requests per page")
        retention = scenarios.add_parser(
            "retention", help="The sweeper's retention catching up on a seeded database "
                              "(PostgreSQL; seed first), with selector rounds beside it.")
        retention.add_argument("--retention-days", type=int, default=1,
                               help="every queue's retention during the run (restored after)")
        retention.add_argument("--minutes", type=float, default=60,
                               help="longest the catching up may take")
        retention.add_argument("--queue", default="bench-0",
                               help="a seeded queue whose selector rounds are timed")
        retention.add_argument("--selector-rounds", type=int, default=50)
        soak = scenarios.add_parser(
            "soak", help="Resident memory of web, clusters and selector over a long run, and of "
                         "the web process while it streams a large export (seed first).")
        soak.add_argument("--minutes", type=float, default=30)
        soak.add_argument("--export-queue", default="bench-0",
                          help="a seeded queue whose whole CSV export is streamed at the end")
        migrations = scenarios.add_parser(
            "migrations", help="Time the newest migrations backwards and forwards on this "
                               "database (seed it first).")
        migrations.add_argument("--count", type=int, default=3, help="how many of the newest")
        operators = scenarios.add_parser(
            "operators", help="Dashboard users (locust) on uvicorn while 2 clusters work through "
                              "a backlog: page p50/p95, errors, throughput with and without "
                              "users, CPU per process (PostgreSQL).")
        operators.add_argument("--users", type=int, default=50)
        operators.add_argument("--streams", type=int, default=10,
                               help="users that also hold the queue's live stream open")
        operators.add_argument("--seconds", type=float, default=120,
                               help="the users' window; each quiet window is half as long")
        operators.add_argument("--items", type=int, default=300_000,
                               help="backlog: enough that the clusters stay busy to the end")
        operators.add_argument("--clusters", type=int, default=2)
        operators.add_argument("--spawn-rate", type=float, default=2,
                               help="users started per second (sign-ins, before the window)")

    def handle(self, *args, scenario, **options):
        if settings.DEBUG:
            # DEBUG records every query in memory and formats its SQL: figures would be wrong.
            self.stderr.write("warning: DEBUG is on; run benchmarks with DEBUG=false")
        if scenario == "selector":
            datasets = options["dataset"] or ([] if options["queue"]
                                              else list(bench.SELECTOR_DATASETS))
            try:
                report = bench.run_selector(
                    datasets=datasets, queues=options["queue"], rounds=options["rounds"],
                    fairness_rounds=options["fairness_rounds"],
                    working_clusters=options["working_clusters"],
                    working_seconds=options["working_seconds"], log=self.stdout.write)
            except ValueError as exc:
                raise CommandError(str(exc)) from exc
        elif scenario == "planner":
            accounts = options["accounts"] or list(bench.PLANNER_ACCOUNTS)
            if min(accounts) < 1 or options["batch"] < 1 or options["runs"] < 1:
                raise CommandError("--accounts, --batch and --runs must be at least 1")
            report = bench.run_planner(accounts=accounts, batch_size=options["batch"],
                                       runs=options["runs"])
        elif scenario == "stream":
            if options["events"] < 4 or options["clients"] < 1 or options["rate"] <= 0:
                raise CommandError("--events must be at least 4, --clients at least 1, "
                                   "--rate positive")
            report = bench.run_stream(events=options["events"], clients=options["clients"],
                                      rate=options["rate"], idle_seconds=options["idle_seconds"],
                                      log=self.stdout.write)
        elif scenario == "pages":
            if options["requests"] < 1:
                raise CommandError("--requests must be at least 1")
            report = bench.run_pages(queue_key=options["queue"], requests=options["requests"],
                                     log=self.stdout.write)
        elif scenario == "retention":
            if options["retention_days"] < 1 or options["minutes"] <= 0 or \
                    options["selector_rounds"] < 1:
                raise CommandError("--retention-days and --selector-rounds must be at least 1, "
                                   "--minutes positive")
            try:
                report = bench_retention.run_retention(
                    retention_days=options["retention_days"], minutes=options["minutes"],
                    selector_queue=options["queue"], selector_rounds=options["selector_rounds"],
                    log=self.stdout.write)
            except RuntimeError as exc:
                raise CommandError(str(exc)) from None
        elif scenario == "migrations":
            if options["count"] < 1:
                raise CommandError("--count must be at least 1")
            try:
                report = bench_upgrade.run_migrations(count=options["count"],
                                                      log=self.stdout.write)
            except RuntimeError as exc:
                raise CommandError(str(exc)) from None
        elif scenario == "soak":
            if options["minutes"] <= 0:
                raise CommandError("--minutes must be positive")
            try:
                report = bench_soak.run_soak(minutes=options["minutes"],
                                             export_queue=options["export_queue"],
                                             log=self.stdout.write)
            except RuntimeError as exc:
                raise CommandError(str(exc)) from None
        elif options["items"] < 1:
            raise CommandError("--items must be at least 1")
        elif scenario == "operators":
            if connection.vendor != "postgresql":
                raise CommandError("bench operators needs PostgreSQL: the live stream listens "
                                   "to it")
            if min(options["users"], options["clusters"]) < 1 or options["seconds"] <= 0 or \
                    not 0 <= options["streams"] <= options["users"] or options["spawn_rate"] <= 0:
                raise CommandError("--users and --clusters must be at least 1, --seconds and "
                                   "--spawn-rate positive, --streams between 0 and --users")
            report = bench_operators.run_operators(
                users=options["users"], streams=options["streams"], seconds=options["seconds"],
                items=options["items"], clusters=options["clusters"],
                spawn_rate=options["spawn_rate"], log=self.stdout.write)
        elif scenario == "bulk":
            report = bench.run_bulk(items=options["items"],
                                    selector_rounds=options["selector_rounds"],
                                    selector_queue=options["selector_queue"],
                                    log=self.stdout.write)
        elif scenario == "api":
            report = bench.run_api(
                batched_items=options["items"], single_items=options["single_items"],
                clients=options["clients"], server_workers=options["server_workers"],
                log=self.stdout.write)
        elif scenario == "throughput":
            report = bench.run_throughput(
                items=options["items"], accounts=options["accounts"],
                clusters=options["clusters"], bare_items=options["bare_items"],
                timeout=options["timeout"], log=self.stdout.write)
        elif scenario == "workload":
            if options["clusters"] < 2 or min(options["accounts"], options["runs"]) < 1:
                raise CommandError("--clusters must be at least 2 (one is killed), --accounts "
                                   "and --runs at least 1")
            report = bench_workload.run_workload(
                items=options["items"], clusters=options["clusters"],
                accounts=options["accounts"], trickle_seconds=options["trickle_seconds"],
                drain_timeout=options["drain_timeout"], runs=options["runs"],
                log=self.stdout.write)
        elif scenario == "peers":
            if connection.vendor != "postgresql":
                raise CommandError("bench peers needs PostgreSQL: procrastinate runs on nothing "
                                   "else")
            if min(options["clusters"], options["runs"], options["accounts"]) < 1 or \
                    not 0 < options["finished_share"] <= 1:
                raise CommandError("--clusters, --runs and --accounts must be at least 1, "
                                   "--finished-share in (0, 1]")
            report = bench_peers.run_peers(
                items=options["items"], clusters=options["clusters"], runs=options["runs"],
                accounts=options["accounts"],
                systems=list(dict.fromkeys(options["system"] or bench_peers.SYSTEMS)),
                share=options["finished_share"], log=self.stdout.write)
        elif scenario == "seed":
            report = bench.run_seed(items=options["items"], accounts=options["accounts"],
                                    queues=options["queues"], log=self.stdout.write)
        else:
            if not 1 <= options["batch"] <= 1000:
                raise CommandError("--batch must be between 1 and 1000")
            report = bench.run_enqueue(items=options["items"], batch=options["batch"],
                                       accounts=options["accounts"])
        self.stdout.write(report.as_table())
        self.stdout.write(f"written to {report.write_json()}")
