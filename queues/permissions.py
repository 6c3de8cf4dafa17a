"""Roles and the checks every dashboard view makes on the server. Templates hide what a role
cannot do, but only these checks refuse it.

Roles are Django groups created by a migration; each role includes the ones before it:
Viewer reads everything, Operator also acts on items, Admin also edits queue settings.

A second factor (django-otp) comes before every role: a user with a confirmed authenticator has
no role until this session has given a code, nor has an Admin without one while
REQUIRE_TWO_FACTOR_FOR_ADMINS is on.
"""

from contextlib import suppress
from functools import wraps

from django.apps import apps
from django.contrib.auth.models import Group, Permission
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.shortcuts import render
from django.urls import NoReverseMatch, reverse
from django_htmx.http import HttpResponseClientRedirect

from queues.conf import setting

VIEWER, OPERATOR, ADMIN = "Viewer", "Operator", "Admin"
ROLES = (VIEWER, OPERATOR, ADMIN)
# Models an Admin edits (or reads) in Django's admin site at /django-admin/.
ADMIN_MODEL_PERMISSIONS = {
    "queues": ("queue", "accountpolicy", "item", "deadletter", "auditentry", "apitoken"),
    "auth": ("user", "group"),
}
_UNSET = object()
# What a signed-in user may have to do before anything else, and the page where they do it
# (queues.web.two_factor_urls).
VERIFY, ENROL = "verify", "enrol"
SECOND_FACTOR_PAGES = {VERIFY: "two_factor_verify", ENROL: "two_factor"}
TWO_FACTOR_APPS = ("django_otp", "django_otp.plugins.otp_totp", "django_otp.plugins.otp_static")


def group_role(user) -> str | None:
    """The highest role the user's groups give, second factor aside; remembered on the user
    object for the request."""
    if not (user.is_authenticated and user.is_active):
        return None
    if user.is_superuser:
        return ADMIN
    role = getattr(user, "_queueadmin_role", _UNSET)
    if role is _UNSET:
        names = set(user.groups.filter(name__in=ROLES).values_list("name", flat=True))
        role = next((name for name in reversed(ROLES) if name in names), None)
        user._queueadmin_role = role
    return role


def two_factor_installed() -> bool:
    """django-otp's apps are in the project: two-factor login is available. A host project
    without them keeps its own sign-in policy."""
    return all(apps.is_installed(app) for app in TWO_FACTOR_APPS)


def second_factor_due(user) -> str | None:
    """VERIFY when the user has a confirmed authenticator that this session has not verified,
    ENROL when an Admin has none while the setting requires one, else None. Remembered on the
    user object for the request; forget_second_factor() after a change."""
    if not (user.is_authenticated and two_factor_installed()):
        return None
    due = getattr(user, "_queueadmin_second_factor", _UNSET)
    if due is _UNSET:
        due = _second_factor_due(user)
        user._queueadmin_second_factor = due
    return due


def _second_factor_due(user) -> str | None:
    from django_otp.plugins.otp_totp.models import TOTPDevice

    # django-otp's OTPMiddleware installs is_verified(); a user object that did not come
    # through it counts as unverified, so a missing middleware refuses rather than lets in.
    is_verified = getattr(user, "is_verified", None)
    if is_verified is not None and is_verified():
        return None
    if TOTPDevice.objects.filter(user=user, confirmed=True).exists():
        return VERIFY
    if setting("REQUIRE_TWO_FACTOR_FOR_ADMINS") and group_role(user) == ADMIN:
        return ENROL
    return None


def forget_second_factor(user):
    """Drop what second_factor_due() remembered, once this request's session has given its
    code."""
    with suppress(AttributeError):
        del user._queueadmin_second_factor


def role_of(user) -> str | None:
    """The user's highest role, or None, also while a second factor is due: every check made
    through it (pages, the live stream, Django's admin site) refuses the user until then."""
    role = group_role(user)
    return None if role is None or second_factor_due(user) else role


def has_role(user, role: str) -> bool:
    actual = role_of(user)
    return actual is not None and ROLES.index(actual) >= ROLES.index(role)


def can_operate(user) -> bool:
    return has_role(user, OPERATOR)


def can_administer(user) -> bool:
    return has_role(user, ADMIN)


def send_to(request, login_url: str | None = None):
    """To the login page (or another page of the sign-in, such as the second factor's) with
    the current page as `next`; an htmx request moves the whole page there."""
    if request.htmx:
        return HttpResponseClientRedirect(redirect_to_login(
            request.htmx.current_url_abs_path or reverse("queues:overview"), login_url
        )["Location"])
    return redirect_to_login(request.get_full_path(), login_url)


def second_factor_page(request, due: str):
    """Where a user whose second factor is due goes. A host project that does not mount
    queues.web.two_factor_urls has no such page: the user is refused instead."""
    try:
        url = reverse(SECOND_FACTOR_PAGES[due])
    except NoReverseMatch:
        raise PermissionDenied("This needs a second factor.") from None
    return send_to(request, url)


def signed_in(view):
    """Login only: the page where a user gives their second factor, before any role."""

    @wraps(view)
    def wrapped(request, *args, **kwargs):
        if not request.user.is_authenticated:
            return send_to(request)
        return view(request, *args, **kwargs)

    return wrapped


def verified_required(view):
    """Login, and the second factor of a user who has one, but no role: a user's own two-factor
    settings, where an Admin who must enrol goes before anything else."""

    @wraps(view)
    def wrapped(request, *args, **kwargs):
        if not request.user.is_authenticated:
            return send_to(request)
        if second_factor_due(request.user) == VERIFY:
            return second_factor_page(request, VERIFY)
        return view(request, *args, **kwargs)

    return wrapped


def role_required(role: str):
    """Login first (htmx requests are sent to the login page as a whole), then the second
    factor when one is due, then the role."""

    def decorator(view):
        @wraps(view)
        def wrapped(request, *args, **kwargs):
            if not request.user.is_authenticated:
                return send_to(request)
            if due := second_factor_due(request.user):
                return second_factor_page(request, due)
            if not has_role(request.user, role):
                raise PermissionDenied(f"This needs the {role} role.")
            return view(request, *args, **kwargs)

        return wrapped

    return decorator


viewer_required = role_required(VIEWER)
operator_required = role_required(OPERATOR)
admin_required = role_required(ADMIN)


def roles(request):
    """Template context: what the signed-in user may do, so templates show only that."""
    user = request.user
    return {
        "role": role_of(user),
        "can_operate": can_operate(user),
        "can_administer": can_administer(user),
        # The header offers only the way to give it (or to log out) while it is due.
        "second_factor_due": second_factor_due(user),
    }


def grant_admin_permissions(**kwargs):
    """post_migrate: the Admin group gets the model permissions Django's admin site checks.
    Permissions are created by post_migrate too, so a migration cannot grant them."""
    group = Group.objects.filter(name=ADMIN).first()
    if group is None:
        return
    for app_label, models in ADMIN_MODEL_PERMISSIONS.items():
        group.permissions.add(*Permission.objects.filter(
            content_type__app_label=app_label, content_type__model__in=models))


def render_page(request, template: str, context: dict | None = None, **kwargs):
    """django.shortcuts.render with what the signed-in user may do, so that templates show only
    that; a host project needs no context processor of ours."""
    return render(request, template, {**roles(request), **(context or {})}, **kwargs)
