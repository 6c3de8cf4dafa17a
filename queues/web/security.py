"""Request facts the security settings need that Django does not provide itself."""

from django.conf import settings
from django.utils.http import url_has_allowed_host_and_scheme


def client_ip(request) -> str | None:
    """The client's address for login throttling (django-axes). In production the app runs behind
    the TLS proxy that settings already trust for X-Forwarded-Proto; that proxy appends the address
    it saw as the last X-Forwarded-For entry, while earlier entries are whatever the client sent.
    Without a proxy every client would share the proxy's address and lock each other out."""
    if getattr(settings, "SECURE_PROXY_SSL_HEADER", None):
        forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "")
        last = forwarded.rsplit(",", 1)[-1].strip()
        if last:
            return last[:45]
    return request.META.get("REMOTE_ADDR")


def page_to_return_to(request, fallback: str) -> str:
    """The `next` page a form names, if it is a path on this site, else `fallback`. A path:
    Django's redirect() reads any other text as a view name and fails on what it cannot
    reverse ("²"), after the form's change was made."""
    target = request.POST.get("next") or request.GET.get("next", "")
    if target.startswith("/") and url_has_allowed_host_and_scheme(
            target, allowed_hosts={request.get_host()}, require_https=request.is_secure()):
        return target
    return fallback
