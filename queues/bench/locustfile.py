"""Dashboard users for `manage.py bench operators`, run by locust (headless) in a process of its
own; never imported by the product nor by the bench's Python code (locust patches the standard
library with gevent on import). The bench writes a plan (JSON) and names it in
QUEUEADMIN_LOAD_PLAN:

    locust -f queues/bench/locustfile.py --headless -u 50 -r 5 --host http://127.0.0.1:PORT

Each user acts as a person with the dashboard open would:

- signs in through the real login form (GET the form for its CSRF token, POST the username and
  password; Django's session cookie from then on), as one of the Viewer users the bench created;
- once every 5 s (locust's constant pacing) makes one request, in a cycle of three: the
  overview `/` as a page (back on the overview), the overview's refresh (`/` with HX-Request,
  what dashboard.js's 5-second tick fetches), then another dashboard page picked at random from
  the plan (queue page with filters, item page, errors, accounts, dead letters, audit), so the
  overview is refreshed every 5 s except when another page is open, and another page is opened
  every 15 s; each user starts at a random point of the cycle;
- the first `streams` users also open the queue's live stream page and keep its server-sent
  events open in a greenlet (`/queues/<key>/stream/events/`, the URL the page's EventSource
  reads), reading every event; when the server ends the stream they reconnect after 2 s with
  Last-Event-ID, as EventSource does. Event rows and summary rows (the server's count of the
  events past its row cap) are counted apart, with the events the summaries count.

When the last user has signed in, the statistics are reset (sign-ins and ramp-up are not
measured), the plan's `ready_file` is written, and locust quits `seconds` later, writing its CSV
statistics. The streams' own counts go to the plan's `stream_file`.
"""

import itertools
import json
import os
import random
import re
import time
from collections import Counter
from pathlib import Path

import gevent
import requests
from locust import HttpUser, constant_pacing, events, task

PLAN = json.loads(Path(os.environ["QUEUEADMIN_LOAD_PLAN"]).read_text())
CSRF_FIELD = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')
SUMMARY_COUNT = re.compile(r'<tr class="stream-summary" data-summary data-count="(\d+)"')
LOGIN_URL = "/accounts/login/"
RECONNECT_SECONDS = 2.0  # the stream's `retry:` field
SIGN_IN_TRIES = 10

_numbers = itertools.count()
_signed_in = 0
_streams = Counter()  # what the stream greenlets saw since the statistics were reset


class Operator(HttpUser):
    wait_time = constant_pacing(PLAN["tick_seconds"])

    def on_start(self):
        global _signed_in
        self.number = next(_numbers)
        self.step = random.randrange(3)
        self.follower = None
        for _ in range(SIGN_IN_TRIES):  # as a person would, again after a failed sign-in
            if self.sign_in():
                break
            gevent.sleep(RECONNECT_SECONDS)
        else:
            raise RuntimeError(f"user {self.number} could not sign in")
        if self.number < PLAN["streams"]:
            self.page(f"/queues/{PLAN['queue']}/stream/", "stream page")
            self.follower = gevent.spawn(self.follow_stream)
        _signed_in += 1
        if _signed_in == self.environment.parsed_options.num_users:
            self.environment.runner.stats.reset_all()
            _streams.clear()
            Path(PLAN["ready_file"]).write_text(str(time.time()))
            gevent.spawn_later(PLAN["seconds"], self.environment.runner.quit)

    def sign_in(self) -> bool:
        form = self.client.get(LOGIN_URL, name="sign in: form")
        token = CSRF_FIELD.search(form.text)
        with self.client.post(LOGIN_URL, name="sign in: post", allow_redirects=False,
                              catch_response=True, data={
                                  "csrfmiddlewaretoken": token.group(1) if token else "",
                                  "username": PLAN["usernames"][self.number],
                                  "password": PLAN["password"]}) as response:
            if response.status_code != 302:
                response.failure(f"sign-in answered {response.status_code}")
                return False
        return True

    def on_stop(self):
        if self.follower is not None:
            self.follower.kill()

    def page(self, url: str, name: str, headers: dict | None = None):
        """A GET that fails on any error status and on a redirect to the login page (a lost
        session would otherwise look like a fast page)."""
        with self.client.get(url, name=name, headers=headers or {},
                             catch_response=True) as response:
            if response.status_code != 200:
                response.failure(f"status {response.status_code}")
            elif LOGIN_URL in response.url or LOGIN_URL in response.headers.get("HX-Redirect",
                                                                                 ""):
                response.failure("sent to the login page")

    @task
    def tick(self):
        step, self.step = self.step, (self.step + 1) % 3
        if step == 0:
            self.page("/", "overview (page)")
        elif step == 1:
            self.page("/", "overview (5 s refresh, htmx)", {"HX-Request": "true"})
        else:
            name, urls = random.choice(PLAN["pages"])
            self.page(random.choice(urls), name)

    def follow_stream(self):
        url = f"{self.host}/queues/{PLAN['queue']}/stream/events/"
        last_id = None
        with requests.Session() as session:
            session.cookies.update(self.client.cookies)
            while True:
                headers = {"Accept": "text/event-stream", "Cache-Control": "no-cache"}
                if last_id:
                    headers["Last-Event-ID"] = last_id
                started = time.perf_counter()
                exception = None
                try:
                    with session.get(url, headers=headers, stream=True,
                                     timeout=(10, 60)) as response:
                        if response.status_code != 200:
                            raise requests.HTTPError(f"status {response.status_code}")
                        event, first = None, True
                        for line in response.iter_lines(chunk_size=None, decode_unicode=True):
                            if line.startswith("id: "):
                                last_id = line[4:]
                            elif line.startswith("event: "):
                                event = line[7:]
                            elif line.startswith("data: ") and event == "rows":
                                summary = SUMMARY_COUNT.search(line)
                                if summary:
                                    _streams["summary rows received"] += 1
                                    _streams["events in summaries"] += int(summary.group(1))
                                else:
                                    _streams["rows received"] += 1
                            elif not line and event:
                                _streams[f"'{event}' messages"] += 1
                                if first and event == "rows":
                                    first = False
                                    self.environment.events.request.fire(
                                        request_type="SSE", name="stream: open to first rows",
                                        response_time=(time.perf_counter() - started) * 1000,
                                        response_length=0, exception=None, context={})
                                event = None
                    _streams["ended by the server"] += 1
                except (requests.RequestException, OSError) as error:
                    exception = error
                if exception is not None:
                    self.environment.events.request.fire(
                        request_type="SSE", name="stream: open to first rows",
                        response_time=(time.perf_counter() - started) * 1000,
                        response_length=0, exception=exception, context={})
                gevent.sleep(RECONNECT_SECONDS)


@events.quitting.add_listener
def _write_stream_counts(environment, **_):
    Path(PLAN["stream_file"]).write_text(json.dumps(dict(_streams)))
