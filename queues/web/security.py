"""Request facts the security settings need that Django does not provide itself."""

from django.utils.http import url_has_allowed_host_and_scheme


def client_ip(request) -> str | None:
    """The client's address for login throttling (django-axes): the peer address, which uvicorn
    (`--proxy-headers`) sets from X-Forwarded-For only when the peer is a proxy listed in
    FORWARDED_ALLOW_IPS. Never the header itself: a client that reaches the app directly would
    name any address in it, escaping its own lock or locking out someone else's."""
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
