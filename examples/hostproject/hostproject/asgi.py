"""ASGI entry point: `python -m uvicorn hostproject.asgi:application` (the live stream needs
an ASGI server; under WSGI its page polls instead)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hostproject.settings")

application = get_asgi_application()
