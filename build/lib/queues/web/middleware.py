"""Renders dashboard times in the signed-in user's time zone (UTC unless they chose another)."""

import zoneinfo

from django.contrib.auth.signals import user_logged_in
from django.dispatch import receiver
from django.utils import timezone

SESSION_KEY = "queueadmin_tz"


class UserTimeZoneMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        name = request.session.get(SESSION_KEY) if hasattr(request, "session") else None
        try:
            timezone.activate(zoneinfo.ZoneInfo(name or "UTC"))
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            timezone.activate(zoneinfo.ZoneInfo("UTC"))
        try:
            return self.get_response(request)
        finally:
            timezone.deactivate()


@receiver(user_logged_in)
def remember_time_zone(sender, request, user, **kwargs):
    """The choice lives in UserPreference; the session copy spares every page a query."""
    from queues.models import UserPreference

    preference = UserPreference.objects.filter(user=user).first()
    request.session[SESSION_KEY] = preference.time_zone if preference else "UTC"
