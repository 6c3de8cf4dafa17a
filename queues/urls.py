from django.urls import path

from queues import bulk_views, stream_views, views

urlpatterns = [
    path("", views.overview, name="overview"),
    path("queues/<str:key>/", views.queue_items, name="queue_items"),
    path("queues/<str:key>/errors/", views.queue_errors, name="queue_errors"),
    path("queues/<str:key>/accounts/", views.queue_accounts, name="queue_accounts"),
    path("queues/<str:key>/counts/", views.queue_counts, name="queue_counts"),
    path("queues/<str:key>/stream/", stream_views.stream_page, name="queue_stream"),
    path("queues/<str:key>/stream/events/", stream_views.stream_events,
         name="queue_stream_events"),
    path("queues/<str:key>/stream/rows/", stream_views.stream_rows, name="queue_stream_rows"),
    path("stream/", stream_views.stream_page, name="all_stream"),
    path("stream/events/", stream_views.stream_events, name="all_stream_events"),
    path("stream/rows/", stream_views.stream_rows, name="all_stream_rows"),
    path("queues/<str:key>/bulk/", bulk_views.bulk_page, name="bulk"),
    path("queues/<str:key>/bulk/start/", bulk_views.bulk_start, name="bulk_start"),
    path("queues/<str:key>/bulk/<int:pk>/", bulk_views.bulk_operation, name="bulk_operation"),
    path("queues/<str:key>/bulk/<int:pk>/stop/", bulk_views.bulk_stop, name="bulk_stop"),
    path("items/<int:pk>/", views.item_detail, name="item_detail"),
    path("items/<int:pk>/<slug:action>/", views.item_action, name="item_action"),
    path("search/", views.search, name="search"),
    path("activity/", views.activity, name="activity"),
    path("activity/selector/", views.run_selector, name="run_selector"),
    path("activity/sweeper/", views.run_sweeper, name="run_sweeper"),
    path("audit/", views.audit_log, name="audit"),
    path("dead-letters/", views.dead_letters, name="dead_letters"),
    path("preferences/", views.preferences, name="preferences"),
]
