"""What a web process does once, after Django is set up and before it serves."""

import gc

from django.urls import get_resolver


def freeze_what_lives_forever():
    """Moves every object alive now (Django, the apps, the views the URLconf imports) out of
    the garbage collector's sight. They live as long as the process, yet each full collection
    walked them all: 50 to 65 ms added to about one overview request in twenty at 100 queues
    (docs/benchmarks.md, session 16). Garbage from the imports is collected first, since
    frozen objects are never collected."""
    _ = get_resolver().url_patterns  # imports the view modules now, not on the first request
    gc.collect()
    gc.freeze()
