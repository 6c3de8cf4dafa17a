"""Old module paths kept importable after the package moved into layers.

django-q2 stores task functions by dotted path: schedule rows (rewritten on every migrate) and
tasks already queued when a new version deploys (pickled, so never rewritten) can still name
`queues.selector.tick` or `queues.worker.run_batch`. The public names in SPEC.md
(`queues.handlers.handler`, `queues.fairness.plan_batch`) keep working the same way. An old path
imports the module that lives at the new one, as the same module object.
"""

import importlib
import importlib.abc
import importlib.util
import sys

MOVED = {
    "queues.audit": "queues.engine.audit",
    "queues.bulk": "queues.engine.bulk",
    "queues.counters": "queues.engine.counters",
    "queues.db": "queues.engine.db",
    "queues.fairness": "queues.engine.fairness",
    "queues.handlers": "queues.engine.handlers",
    "queues.heartbeat": "queues.engine.heartbeat",
    "queues.lease": "queues.engine.lease",
    "queues.lifecycle": "queues.engine.lifecycle",
    "queues.pausing": "queues.engine.pausing",
    "queues.schedules": "queues.engine.schedules",
    "queues.selector": "queues.engine.selector",
    "queues.stream": "queues.engine.stream",
    "queues.sweeper": "queues.engine.sweeper",
    "queues.tokens": "queues.engine.tokens",
    "queues.webhook": "queues.engine.webhook",
    "queues.worker": "queues.engine.worker",
}


class MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module):
        # The module ran under its new name already; the import system only needs to have
        # registered it under the old one as well.
        pass


def install():
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())
