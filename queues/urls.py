from django.urls import path, re_path

from queues.models import QUEUE_KEY_PATTERN
from queues.ops import health
from queues.web import alerts, audit, bulk, charts, pages, pause, stream, tenants, tokens

app_name = "queues"

urlpatterns = [
    path("", pages.overview, name="overview"),
    path("queues/<queue:key>/", pages.queue_items, name="queue_items"),
    path("queues/<queue:key>/errors/", pages.queue_errors, name="queue_errors"),
    path("queues/<queue:key>/accounts/", pages.queue_accounts, name="queue_accounts"),
    path("queues/<queue:key>/counts/", pages.queue_counts, name="queue_counts"),
    path("queues/<queue:key>/stream/", stream.stream_page, name="queue_stream"),
    path("queues/<queue:key>/stream/events/", stream.stream_events,
         name="queue_stream_events"),
    path("queues/<queue:key>/stream/rows/", stream.stream_rows, name="queue_stream_rows"),
    path("stream/", stream.stream_page, name="all_stream"),
    path("stream/events/", stream.stream_events, name="all_stream_events"),
    path("stream/rows/", stream.stream_rows, name="all_stream_rows"),
    path("queues/<queue:key>/bulk/", bulk.bulk_page, name="bulk"),
    path("queues/<queue:key>/bulk/start/", bulk.bulk_start, name="bulk_start"),
    path("queues/<queue:key>/bulk/<int:pk>/", bulk.bulk_operation, name="bulk_operation"),
    path("queues/<queue:key>/bulk/<int:pk>/stop/", bulk.bulk_stop, name="bulk_stop"),
    re_path(rf"^queues/(?P<key>{QUEUE_KEY_PATTERN})/(?P<action>pause|resume)/$", pause.queue_pause,
            name="queue_pause"),
    re_path(rf"^queues/(?P<key>{QUEUE_KEY_PATTERN})/accounts/(?P<action>pause|resume)/$",
            pause.account_pause, name="account_pause"),
    re_path(r"^(?P<action>pause|resume)-all/$", pause.global_pause, name="global_pause"),
    re_path(rf"^queues/(?P<key>{QUEUE_KEY_PATTERN})/export\.(?P<fmt>csv|json)$", pages.queue_export,
            name="queue_export"),
    path("items/<int:pk>/", pages.item_detail, name="item_detail"),
    path("items/<int:pk>/<slug:action>/", pages.item_action, name="item_action"),
    path("history/", charts.history_panel, name="history"),
    path("queues/<queue:key>/history/", charts.history_panel, name="queue_history"),
    # One URL per chart, of every queue (queues:chart_throughput, ...) and of one
    # (queues:queue_chart_throughput, ...), each answering htmx with its fragment.
    *(path(f"history/{name}/", charts.chart, {"name": name}, name=f"chart_{name}")
      for name in charts.CHARTS if name not in charts.QUEUE_ONLY),
    *(path(f"queues/<queue:key>/history/{name}/", charts.chart, {"name": name},
           name=f"queue_chart_{name}") for name in charts.CHARTS),
    path("search/", pages.search, name="search"),
    path("activity/", pages.activity, name="activity"),
    path("activity/selector/", pages.run_selector, name="run_selector"),
    path("activity/sweeper/", pages.run_sweeper, name="run_sweeper"),
    path("workers/", health.workers_page, name="workers"),
    path("alerts/", alerts.alerts_page, name="alerts"),
    path("alerts/rules/<int:pk>/", alerts.rule_edit, name="alert_rule"),
    re_path(r"^alerts/rules/(?P<pk>[0-9]+)/(?P<action>mute|unmute)/$", alerts.rule_mute,
            name="alert_rule_mute"),
    path("alerts/firings/<int:pk>/acknowledge/", alerts.firing_acknowledge,
         name="alert_acknowledge"),
    path("audit/", audit.audit_log, name="audit"),
    path("audit/export/", audit.audit_export, name="audit_export"),
    path("dead-letters/", pages.dead_letters, name="dead_letters"),
    path("preferences/", pages.preferences, name="preferences"),
    path("tokens/", tokens.token_list, name="tokens"),
    path("tenant/", tenants.tenant_data, name="tenant_data"),
    path("tenant/export/", tenants.tenant_export, name="tenant_export"),
    path("tenant/erase/", tenants.tenant_erase, name="tenant_erase"),
    path("tokens/create/", tokens.token_create, name="token_create"),
    path("tokens/<int:pk>/revoke/", tokens.token_revoke, name="token_revoke"),
]
