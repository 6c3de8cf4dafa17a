"""The billing app's django.tasks tasks. QueueAdmin is the project's TASKS backend, so each
`.enqueue()` becomes an item for the tenant of the `tenant()` block around it, run by the same
worker clusters as the `billing.charge` handler's items."""

import asyncio

from django_tasks import task  # Django 6.0 and later: from django.tasks import task
from queues.handlers import PermanentError


@task(queue_name="billing-tasks")
def send_invoice(invoice: str, *, amount: int) -> dict:
    """Pretends to send an invoice; an amount of 0 or less is refused for good."""
    if amount <= 0:
        raise PermanentError(f"invoice {invoice} has no amount to charge")
    return {"invoice": invoice, "amount": amount, "sent": True}


@task(queue_name="billing-tasks", priority=10)
async def refresh_rates(currency: str) -> dict:
    """An async task: the worker runs it in an event loop of its own."""
    await asyncio.sleep(0.01)
    return {"currency": currency, "rate": 1.25}
