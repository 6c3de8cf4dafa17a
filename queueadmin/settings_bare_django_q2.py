"""Settings of the bare django-q2 peer in `manage.py bench workload`: the same project, database
and worker count as QueueAdmin's clusters, with django-q2 configured for throughput as its
documentation describes it: a short poll and successful results not saved. No schedules run, so
QueueAdmin's selector stays off while the peer is measured."""

from queueadmin.settings import *  # noqa: F403
from queueadmin.settings import Q_CLUSTER

Q_CLUSTER = {**Q_CLUSTER, "poll": 0.1, "save_limit": -1, "scheduler": False}
