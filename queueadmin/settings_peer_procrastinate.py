"""Settings of the procrastinate peer in `manage.py bench peers`: the project's settings with only
procrastinate's Django integration (before the app holding its tasks, as its documentation asks)
on a database of its own, which the bench names in DATABASE_URL. Its migrations run there only,
and QueueAdmin's tables never exist beside it."""

from queueadmin.settings import *  # noqa: F403
from queueadmin.settings import LOGGING

INSTALLED_APPS = ["procrastinate.contrib.django", "queues.bench"]
# Workers, migrations and the enqueue command only: no URLs, no middleware.
ROOT_URLCONF = None
MIDDLEWARE = []
# The peer's tasks are named, not discovered in every app's tasks.py.
PROCRASTINATE_AUTODISCOVER_MODULE_NAME = None
PROCRASTINATE_IMPORT_PATHS = ["queues.bench.peer_procrastinate"]
# A log line per job at INFO is noise at this rate, as django-q2's is in the product's settings.
LOGGING = {**LOGGING, "loggers": {**LOGGING["loggers"], "procrastinate": {"level": "WARNING"}}}
