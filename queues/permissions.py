"""Roles and the checks every dashboard view makes on the server. Templates hide what a role
cannot do, but only these checks refuse it.

Roles are Django groups created by a migration; each role includes the ones before it:
Viewer reads everything, Operator also acts on items, Admin also edits queue settings.
"""

from functools import wraps

from django.contrib.auth.models import Group, Permission
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.shortcuts import render
from django.urls import reverse
from django_htmx.http import HttpResponseClientRedirect

VIEWER, OPERATOR, ADMIN = "Viewer", "Operator", "Admin"
ROLES = (VIEWER, OPERATOR, ADMIN)
# Models an Admin edits (or reads) in Django's admin site at /django-admin/.
ADMIN_MODEL_PERMISSIONS = {
    "queues": ("queue", "accountpolicy", "item", "deadletter", "auditentry", "apitoken"),
    "auth": ("user", "group"),
}
_UNSET = object()


def role_of(user) -> str | None:
    """The user's highest role, or None; remembered on the user object for the request."""
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


def has_role(user, role: str) -> bool:
    actual = role_of(user)
    return actual is not None and ROLES.index(actual) >= ROLES.index(role)


def can_operate(user) -> bool:
    return has_role(user, OPERATOR)


def can_administer(user) -> bool:
    return has_role(user, ADMIN)


def role_required(role: str):
    """Login first (htmx requests are sent to the login page as a whole), then the role."""

    def decorator(view):
        @wraps(view)
        def wrapped(request, *args, **kwargs):
            if not request.user.is_authenticated:
                if request.htmx:
                    return HttpResponseClientRedirect(redirect_to_login(
                        request.htmx.current_url_abs_path or reverse("queues:overview")
                    )["Location"])
                return redirect_to_login(request.get_full_path())
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
