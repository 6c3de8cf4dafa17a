"""The history charts (queues.web.charts): each chart's own URL answers htmx with an SVG fragment
with axes, a legend, hover values and a table, from the rollup only; pages carry a panel that
loads them, in the range their URL names."""

import re
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from queues.engine import history
from queues.models import InstallationMinute, MetricHour, MetricMinute, histogram_column
from queues.web import charts
from queues.web.middleware import SESSION_KEY
from tests.factories import QueueFactory

pytestmark = pytest.mark.django_db
HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def queue():
    return QueueFactory(key="emails", name="Emails")


@pytest.fixture
def viewer(role_client):
    return role_client("Viewer")


def last_minutes(n: int):
    newest = timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=1)
    return [newest - timedelta(minutes=i) for i in range(n)]


def clear_of_a_new_minute(margin: float = 3.0):
    """Waits out a minute's last `margin` seconds: the charts end at the last whole minute
    when they are drawn, so an hour filled just before a new minute would be one behind."""
    now = timezone.now()
    left = 60 - now.second - now.microsecond / 1_000_000
    if left < margin:
        time.sleep(left + 0.05)


def fill_last_hour(queue, **values):
    """An hour of the queue's minutes, and the installation's rows summed from them as the
    rollup writes them (the charts of every queue read those)."""
    clear_of_a_new_minute()
    minutes = last_minutes(60)
    for i, minute in enumerate(minutes):
        MetricMinute.objects.create(queue=queue, start=minute, completed=10 + i, enqueued=12,
                                    failed=i % 3, retried=1, depth_queued=100 + i, depth_retry=5,
                                    depth_dispatched=2, depth_running=3, depth_failed=7,
                                    **{histogram_column("wait", history.bucket_of(2.0)): 9,
                                       histogram_column("run", history.bucket_of(0.05)): 9},
                                    **values)
    history.roll_up_installation(InstallationMinute, minutes[-1], minutes[0] + timedelta(minutes=1))


def fragment(client, name: str, query: str = "", key: str | None = "emails"):
    prefix = f"/queues/{key}" if key else ""
    response = client.get(f"{prefix}/history/{name}/?{query}", **HTMX)
    return response, response.content.decode()


def test_the_throughput_chart_has_axes_a_legend_hover_values_and_a_table(viewer, queue):
    fill_last_hour(queue)

    response, html = fragment(viewer, "throughput", "range=1h")

    assert response.status_code == 200
    assert "<html" not in html and '<svg class="history-chart"' in html
    assert "Time (UTC)" in html and "items per minute" in html  # the axes' titles
    assert re.findall(r'class="tick-x"[^>]*>(\d\d:\d0)</text>', html)  # every 10 minutes
    assert re.findall(r'class="tick-y"[^>]*>([\d,]+)</text>', html)[:2] == ["0", "20"]
    assert "<li>" in html and "Completed</li>" in html and "Enqueued</li>" in html
    assert html.count("<rect ") == 60 and "<title>" in html
    rows = re.findall(r'<tr><th scope="row">', html)
    assert len(rows) == 60 and "Show as table" in html
    newest = timezone.localtime(last_minutes(1)[0]).strftime("%H:%M")
    assert f"{newest}: Completed 10; Enqueued 12</title>" in html


@pytest.mark.parametrize("name", [n for n in charts.CHARTS if n != "accounts"])
def test_every_chart_of_a_queue_and_of_all_queues_draws_the_history(viewer, queue, name):
    fill_last_hour(queue)
    for key in ("emails", None):
        response, html = fragment(viewer, name, "range=1h", key)
        assert response.status_code == 200, (name, key)
        assert '<svg class="history-chart"' in html and "<path d=\"M" in html


def test_wait_percentiles_come_from_the_summed_buckets(viewer, queue):
    fill_last_hour(queue)

    _, html = fragment(viewer, "wait", "range=1h")

    low, high = (history.HISTOGRAM_BOUNDS[history.bucket_of(2.0) - 1],
                 history.HISTOGRAM_BOUNDS[history.bucket_of(2.0)])
    assert low <= history.percentile([0] * history.bucket_of(2.0) + [9], 0.95) <= high
    assert "p50</li>" in html and "p95</li>" in html
    assert re.search(r"<td class=\"num\">\d(\.\d)? s</td>", html)


def test_a_duration_axis_is_titled_without_a_unit_its_ticks_carry_their_own(viewer, queue):
    fill_last_hour(queue)
    _, html = fragment(viewer, "wait", "range=1h")
    assert 'rotate(-90)">duration</text>' in html and ">seconds<" not in html
    assert charts._tick_duration(3 * 3600) == "3 h" and charts._tick_duration(2 * 86400) == "2 d"
    assert charts._tick_duration(5400) == "1 h 30 min"


def test_the_depth_chart_shows_in_flight_as_dispatched_plus_running(viewer, queue):
    fill_last_hour(queue)
    _, html = fragment(viewer, "depth", "range=1h")
    assert "In flight 5;" in html and "Dead letters 7" in html


def test_hours_serve_the_longer_ranges(viewer, queue):
    now = timezone.now().replace(minute=0, second=0, microsecond=0)
    for days in range(29):
        MetricHour.objects.create(queue=queue, start=now - timedelta(days=days), completed=60)

    _, week = fragment(viewer, "throughput", "range=7d")
    _, month = fragment(viewer, "throughput", "range=30d")

    assert week.count('<tr><th scope="row">') == 7 * 24 and "items per hour" in week
    assert month.count('<tr><th scope="row">') == 30 * 4 and "items per 6 h" in month
    assert re.findall(r'class="tick-x"[^>]*>(\w{3} \d\d)</text>', month)


def test_the_accounts_chart_draws_each_top_accounts_share(viewer, queue):
    for minute in last_minutes(3):
        MetricMinute.objects.create(queue=queue, start=minute, completed=10)
        MetricMinute.objects.create(queue=queue, account="big", start=minute, completed=6)
        MetricMinute.objects.create(queue=queue, account="small", start=minute, completed=1)

    _, html = fragment(viewer, "accounts", "range=1h")

    assert "big</li>" in html and "small</li>" in html and "Other accounts</li>" in html
    assert "big 60.0%; small 10.0%; Other accounts 30.0%" in html
    assert "% of items completed" in html


def test_an_empty_history_says_so_instead_of_drawing_zeroes(viewer, queue):
    for name in charts.CHARTS:
        response, html = fragment(viewer, name)
        assert response.status_code == 200
        assert "No history for this range yet" in html and "<svg" not in html


def test_history_without_finished_items_says_there_is_no_wait_time(viewer, queue):
    MetricMinute.objects.create(queue=queue, start=last_minutes(1)[0], enqueued=3)
    _, html = fragment(viewer, "wait", "range=1h")
    assert "No item finished in this range" in html


@pytest.mark.parametrize("query", ["range=2y", "range=", "range=1h&range=%00", "show=nope"])
def test_a_bad_range_is_refused_with_400_never_500(viewer, queue, query):
    response = viewer.get(f"/queues/emails/history/throughput/?{query}", **HTMX)
    assert response.status_code in (200, 400)
    assert viewer.get(f"/queues/emails/history/?{query}").status_code in (200, 400)
    page = viewer.get("/history/throughput/?range=2y")
    assert page.status_code == 400 and b"<h1>History</h1>" in page.content
    assert b"Range: Select a valid choice" in page.content


def test_unknown_queues_are_404_and_the_accounts_chart_is_of_one_queue(viewer, queue):
    assert viewer.get("/queues/nope/history/throughput/").status_code == 404
    assert viewer.get("/queues/nope/history/").status_code == 404
    assert viewer.get("/history/accounts/").status_code == 404
    response = viewer.get("/history/?show=accounts", **HTMX)
    assert response.status_code == 400 and b"chart of one queue" in response.content


def test_charts_need_a_login(client, queue):
    response = client.get("/queues/emails/history/throughput/")
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


def test_without_htmx_a_chart_is_a_page_of_its_own(viewer, queue):
    fill_last_hour(queue)
    html = viewer.get("/queues/emails/history/throughput/?range=1h").content.decode()
    assert "<h1>History of Emails</h1>" in html and '<svg class="history-chart"' in html
    assert "charts.css" in html


def test_pages_carry_a_panel_that_loads_each_chart(viewer, queue):
    pages = {"/": ("", charts.PAGE_CHARTS),
             "/queues/emails/": ("/queues/emails", charts.PAGE_CHARTS),
             "/queues/emails/errors/": ("/queues/emails", ["failures"]),
             "/queues/emails/accounts/": ("/queues/emails", ["accounts"])}
    for page, (prefix, names) in pages.items():
        html = viewer.get(page).content.decode()
        for name in names:
            assert f'hx-get="{prefix}/history/{name}/?' in html, (page, name)
        assert 'hx-trigger="load"' in html
        assert f'href="{page}?range=7d"' in html, page


def test_the_page_range_picks_the_charts_range(viewer, queue):
    html = viewer.get("/queues/emails/?range=7d&status=failed").content.decode()
    assert 'hx-get="/queues/emails/history/throughput/?range=7d"' in html
    assert 'href="/queues/emails/?range=1h&amp;status=failed"' in html  # the filter kept
    assert re.search(r'aria-current="true">7 d<', html)


def test_range_links_swap_the_panel_and_keep_the_pages_address(viewer, queue):
    response = viewer.get("/queues/emails/history/?range=30d&show=throughput", **HTMX,
                          HTTP_HX_CURRENT_URL="http://testserver/queues/emails/?status=failed")
    html = response.content.decode()
    assert response.status_code == 200 and '<section id="history"' in html
    assert 'hx-get="/queues/emails/history/throughput/?range=30d"' in html
    assert 'href="/queues/emails/?status=failed&amp;range=1h"' in html


def test_ticks_and_table_times_are_in_the_users_time_zone(viewer, queue):
    fill_last_hour(queue)
    session = viewer.session
    session[SESSION_KEY] = "Asia/Kolkata"
    session.save()

    _, html = fragment(viewer, "throughput", "range=1h")

    assert "Time (Asia/Kolkata)" in html
    newest = timezone.localtime(last_minutes(1)[0], timezone.get_fixed_timezone(330))
    assert f'<th scope="row">{newest:%H:%M}</th>' in html


def test_a_chart_reads_the_rollup_in_a_few_queries(viewer, queue, django_assert_max_num_queries):
    fill_last_hour(queue)
    with django_assert_max_num_queries(6):
        fragment(viewer, "throughput", "range=1h", None)


def test_a_step_still_under_way_is_shaded_and_says_so_far(viewer, queue):
    fill_last_hour(queue)
    now = timezone.now()
    under_way = now.minute % 15 != 0  # a 24 h chart's last 15 minutes are whole at :00, :15...

    _, day = fragment(viewer, "throughput", "range=24h")
    _, hour = fragment(viewer, "throughput", "range=1h")

    assert ('class="partial-step"' in day) is under_way
    assert ("(so far)" in day) is under_way
    assert 'class="partial-step"' not in hour  # a minute is drawn once it is whole
