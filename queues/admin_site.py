"""Django's admin site for Admins: queue settings, account policies, tokens and users. Kept apart
from queues/admin.py, which registers models on it: the default site is built by importing this
module, and building it while the registering module is half-imported loses registrations."""

from functools import update_wrapper

from django.conf import settings
from django.contrib import admin
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import BadRequest, PermissionDenied
from django.shortcuts import redirect

from queues.permissions import can_administer, second_factor_due, second_factor_page


class QueueAdminSite(admin.AdminSite):
    """Open to the Admin role; everyone signs in through the dashboard's login page."""

    site_header = "QueueAdmin settings"
    site_title = "QueueAdmin"
    site_url = "/"

    def has_permission(self, request):
        return can_administer(request.user)

    def admin_view(self, view, cacheable=False):
        """Every view of the site, refusing a NUL in its query: the change lists' filters put
        their values straight into a query, and PostgreSQL's text cannot hold a NUL (a 500 where
        the dashboard's forms answer 400)."""
        checked = super().admin_view(view, cacheable)

        def refuse_nul(request, *args, **kwargs):
            if any("\x00" in key or any("\x00" in value for value in values)
                   for key, values in request.GET.lists()):
                raise BadRequest("A query parameter holds a NUL character.")
            return checked(request, *args, **kwargs)

        return update_wrapper(refuse_nul, checked)

    def login(self, request, extra_context=None):
        if self.has_permission(request):
            return redirect("admin:index")
        if due := second_factor_due(request.user):
            return second_factor_page(request, due)
        if request.user.is_authenticated:
            # Signed in without the Admin role: sending them to log in again would loop.
            raise PermissionDenied("Django's admin site needs the Admin role.")
        return redirect_to_login(request.GET.get("next", self.site_url), settings.LOGIN_URL)
