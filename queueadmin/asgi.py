import os
import sys

from django.core.exceptions import ImproperlyConfigured

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "queueadmin.settings")
# The ASGI web process uses psycopg's connection pool instead of persistent connections.
os.environ.setdefault("QUEUEADMIN_PROCESS", "web")

try:
    from django.core.asgi import get_asgi_application

    application = get_asgi_application()
except ImproperlyConfigured as exc:
    # As manage.py says it: one line naming the setting, not uvicorn's traceback of the import.
    sys.stderr.write(f"Configuration error: {exc}\n")
    sys.exit(2)

from queues.ops.startup import freeze_what_lives_forever  # noqa: E402 - needs Django set up

freeze_what_lives_forever()
