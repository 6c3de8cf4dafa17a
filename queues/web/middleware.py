"""Applies the signed-in user's preferences: dashboard times in their time zone (UTC unless they
chose another) and their colour theme on every page."""

import zoneinfo

from django.contrib.auth.signals import user_logged_in
from django.dispatch import receiver
from django.utils import timezone

SESSION_KEY = "queueadmin_tz"
THEME_SESSION_KEY = "queueadmin_theme"


class UserTimeZoneMiddleware:
    """Activates the time zone, and sets request.queueadmin_theme ("system", "light" or
    "dark"), from which base.html decides how it links the dark palette."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        session = getattr(request, "session", {})
        name = session.get(SESSION_KEY)
        request.queueadmin_theme = session.get(THEME_SESSION_KEY) or "system"
        try:
            timezone.activate(zoneinfo.ZoneInfo(name or "UTC"))
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            timezone.activate(zoneinfo.ZoneInfo("UTC"))
        try:
            return self.get_response(request)
        finally:
            timezone.deactivate()


@receiver(user_logged_in)
def remember_preferences(sender, request, user, **kwargs):
    """The choices live in UserPreference; the session copy spares every page a query."""
    from queues.models import UserPreference

    preference = UserPreference.objects.filter(user=user).first()
    request.session[SESSION_KEY] = preference.time_zone if preference else "UTC"
    request.session[THEME_SESSION_KEY] = (preference.theme if preference
                                          else UserPreference.Theme.SYSTEM)
