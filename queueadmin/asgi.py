import os

from django.core.asgi import get_asgi_application

from queues.ops.startup import freeze_what_lives_forever

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "queueadmin.settings")
# The ASGI web process uses psycopg's connection pool instead of persistent connections.
os.environ.setdefault("QUEUEADMIN_PROCESS", "web")

application = get_asgi_application()
freeze_what_lives_forever()
