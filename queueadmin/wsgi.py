import os

from django.core.wsgi import get_wsgi_application

from queues.ops.startup import freeze_what_lives_forever

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "queueadmin.settings")

application = get_wsgi_application()
freeze_what_lives_forever()
