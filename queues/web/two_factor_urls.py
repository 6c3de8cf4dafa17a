"""Two-factor login's pages, beside the sign-in (queues.web.auth_urls includes them; a host
project with its own login page may include these alone). queues.permissions sends users to
them by these names."""

from django.urls import path

from queues.web import two_factor

urlpatterns = [
    # The code asked after the password.
    path("login/code/", two_factor.verify, name="two_factor_verify"),
    path("two-factor/", two_factor.settings_page, name="two_factor"),
    path("two-factor/setup/", two_factor.setup, name="two_factor_setup"),
    path("two-factor/confirm/", two_factor.confirm, name="two_factor_confirm"),
    path("two-factor/recovery-codes/", two_factor.recovery_codes,
         name="two_factor_recovery_codes"),
    path("two-factor/remove/", two_factor.remove, name="two_factor_remove"),
]
