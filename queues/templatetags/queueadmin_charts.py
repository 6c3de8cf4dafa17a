"""{% history_panel queue "throughput failures" %}: the history charts' panel on a page, in the
range its URL names; each chart loads itself (queues.web.charts)."""

from django import template

from queues.web import charts

register = template.Library()


@register.inclusion_tag("queues/_history.html", takes_context=True)
def history_panel(context, queue=None, show: str = ""):
    names = show.split() or list(charts.PAGE_CHARTS)
    return {"panel": charts.page_panel(context["request"], queue, names)}
