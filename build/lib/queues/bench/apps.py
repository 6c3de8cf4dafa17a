from django.apps import AppConfig


class BenchConfig(AppConfig):
    name = "queues.bench"
    label = "queues_bench"
    verbose_name = "QueueAdmin benchmarks and demo"
