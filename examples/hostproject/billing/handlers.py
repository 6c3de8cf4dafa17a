"""QueueAdmin handlers of the billing app; QueueAdmin imports every installed app's handlers
module at start-up. A queue whose `handler` is "billing.charge" runs `charge` for its items."""

import logging

from queues.handlers import PermanentError, Task, handler

log = logging.getLogger(__name__)


@handler("billing.charge")
def charge(task: Task):
    """Pretends to charge an invoice. A payload {"fail": true} is refused for good (the item
    becomes a dead letter at once), so there is always something to retry from the dashboard."""
    payload = task.payload or {}
    if payload.get("fail"):
        raise PermanentError(f"card declined for {task.account}/{task.identifier}")
    log.info("charged %s for %s (attempt %s)", task.account, task.identifier, task.attempt)
