"""What a long-running process (web or worker cluster) does once, after Django is set up and
before it serves."""

import gc

from django.urls import get_resolver


def freeze_what_lives_forever(*, with_views: bool = True):
    """Moves every object alive now (Django, the apps and, for a web process, the views the
    URLconf imports) out of the garbage collector's sight. They live as long as the process,
    yet each full collection walked them all, about 40 ms: 50 to 65 ms added to one overview
    request in twenty at 100 queues (docs/benchmarks.md, session 16). Garbage from the imports
    is collected first, since frozen objects are never collected. A worker cluster forks its
    processes after this, so they inherit it."""
    if with_views:
        _ = get_resolver().url_patterns  # imports the view modules now, not on first request
    gc.collect()
    gc.freeze()
