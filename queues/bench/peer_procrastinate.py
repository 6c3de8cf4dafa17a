"""The procrastinate peer's task and enqueue, imported only in processes that run with
queueadmin/settings_peer_procrastinate.py (its Django app must be ready first)."""

from procrastinate.contrib.django import app

from queues.engine import handlers

BATCH = 1000  # jobs per batch_defer call, as QueueAdmin's enqueue_many takes 1,000 per call


@app.task(name="bench_work")
def bench_work(number: int, work: dict, completions_file: str):
    """The same work as QueueAdmin's `workload` handler and the bare django-q2 peer's task."""
    handlers.run_work(work, 1)
    handlers.note_completion(completions_file, f"procrastinate-{number}", 1)


def enqueue(work_list: list[dict], completions_file: str):
    for offset in range(0, len(work_list), BATCH):
        bench_work.batch_defer(*(
            {"number": offset + n, "work": w, "completions_file": completions_file}
            for n, w in enumerate(work_list[offset:offset + BATCH])))
