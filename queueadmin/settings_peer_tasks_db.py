"""Settings of the django-tasks-db peer in `manage.py bench peers`: the project's settings with
only django-tasks-db's app, made the `TASKS` backend in place of QueueAdmin's, on a database of
its own, which the bench names in DATABASE_URL. Its migrations run there only."""

from queueadmin.settings import *  # noqa: F403

INSTALLED_APPS = ["django_tasks_db", "queues.bench"]
# Workers, migrations and the enqueue command only: no URLs, no middleware.
ROOT_URLCONF = None
MIDDLEWARE = []
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["default"]}}
