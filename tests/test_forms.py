"""queues.web.forms: the select of many options (every queue, every time zone), rendered in
Python, says what Django's own select says."""

import pytest
from django import forms
from django.test.html import parse_html

from queues.web.forms import DeadLetterFilterForm, LongSelect
from tests.factories import QueueFactory

pytestmark = pytest.mark.django_db


class Both(forms.Form):
    ours = forms.ChoiceField(choices=[("", "Every <queue>"), ("a&b", 'A "&" B'), ("c", "C")],
                             widget=LongSelect, required=False)
    djangos = forms.ChoiceField(choices=[("", "Every <queue>"), ("a&b", 'A "&" B'), ("c", "C")],
                                required=False)


@pytest.mark.parametrize("value", ["", "a&b", "c"])
def test_the_queue_select_renders_as_djangos_select_does(value):
    form = Both({"ours": value, "djangos": value})
    ours = str(form["ours"]).replace('name="ours" id="id_ours"', "")
    djangos = str(form["djangos"]).replace('name="djangos" id="id_djangos"', "")
    assert parse_html(ours) == parse_html(djangos)
    assert "<queue>" not in ours and "&lt;queue&gt;" in ours


def test_a_filter_offers_every_queue_and_keeps_the_chosen_one():
    for key in ("reports", "emails"):
        QueueFactory(key=key)
    html = str(DeadLetterFilterForm({"queue": "reports"})["queue"])
    assert html.index('value="emails"') < html.index('value="reports"')
    assert '<option value="reports" selected>reports</option>' in html
