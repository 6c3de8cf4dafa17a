"""The JSON API's routes; a project includes them wherever it likes, e.g. at /api/v1/."""

from django.urls import path, re_path

from queues.api import views
from queues.models import QUEUE_KEY_PATTERN

app_name = "queues_api"

urlpatterns = [
    path("queues", views.queue_list, name="queues"),
    path("queues/<queue:key>/items", views.enqueue, name="enqueue"),
    path("items/<int:item_id>", views.item_detail, name="item"),
    path("queues/<queue:key>/bulk/preview", views.bulk_preview, name="bulk-preview"),
    path("queues/<queue:key>/bulk", views.bulk_start, name="bulk-start"),
    path("bulk/<int:pk>", views.bulk_detail, name="bulk"),
    path("bulk/<int:pk>/stop", views.bulk_stop, name="bulk-stop"),
    re_path(rf"^queues/(?P<key>{QUEUE_KEY_PATTERN})/(?P<action>pause|resume)$", views.queue_pause,
            name="queue-pause"),
    re_path(rf"^queues/(?P<key>{QUEUE_KEY_PATTERN})/accounts/(?P<action>pause|resume)$",
            views.account_pause, name="account-pause"),
    re_path(r"^(?P<action>pause|resume)-all$", views.global_pause, name="global-pause"),
    path("openapi.json", views.openapi, name="openapi"),
    # Last: anything else under the API answers a JSON 404, never the site's HTML page.
    re_path(r"^(?P<path>[\s\S]*)$", views.not_found, name="not-found"),  # newlines too
]
