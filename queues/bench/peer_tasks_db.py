"""The django-tasks-db peer's task and enqueue, imported only in processes that run with
queueadmin/settings_peer_tasks_db.py (django-tasks-db is their `TASKS` backend)."""

from django_tasks import task

from queues.engine import handlers


@task()
def bench_work(number: int, work: dict, completions_file: str):
    """The same work as QueueAdmin's `workload` handler and the bare django-q2 peer's task."""
    handlers.run_work(work, 1)
    handlers.note_completion(completions_file, f"tasks-db-{number}", 1)


def enqueue(work_list: list[dict], completions_file: str):
    # django.tasks has no batch enqueue: one call (one INSERT) per task.
    for number, task_work in enumerate(work_list):
        bench_work.enqueue(number, task_work, completions_file)
