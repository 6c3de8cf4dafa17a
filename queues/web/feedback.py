"""What an action tells the page it came from: refresh the regions that show what changed
(they listen for queueadmin:changed) and say in words what was done (queueadmin:toast)."""

from django_htmx.http import trigger_client_event

CHANGED_EVENT = "queueadmin:changed"
TOAST_EVENT = "queueadmin:toast"


def changed(response, **what):
    return trigger_client_event(response, CHANGED_EVENT, what)


def changed_and_said(response, message: str, *, ok: bool = True, **what):
    return trigger_client_event(changed(response, **what), TOAST_EVENT,
                                {"message": message, "ok": ok})
