"""The dashboard's answer when the database cannot be reached: down, restarting, or every
connection of the web process's pool busy under load. That is a 503 the browser may retry, as
the JSON API answers, not a server fault with a 500 page."""

import sys

from django.db import InterfaceError, OperationalError
from django.http import HttpResponse
from django.template import loader
from django.views import defaults

RETRY_AFTER_SECONDS = 5


def server_error(request, template_name=defaults.ERROR_500_TEMPLATE_NAME):
    """handler500 (queueadmin/urls.py; a host project sets it the same way). Django calls it
    inside the handling of the exception, from a view or a middleware, so the exception is at
    hand; the page is rendered without a request context, which could need the database."""
    if isinstance(sys.exc_info()[1], OperationalError | InterfaceError):
        response = HttpResponse(loader.render_to_string("queues/503.html"), status=503)
        response["Retry-After"] = str(RETRY_AFTER_SECONDS)
        return response
    return defaults.server_error(request, template_name)
