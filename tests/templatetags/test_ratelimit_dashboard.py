"""ratelimit_app.templatetags.ratelimit_dashboard: the dashboard's `count` and `percent` filters, as a
template that loads them renders them."""

from __future__ import annotations

from typing import Any

import pytest
from django.template import Context, Template

from ratelimit_app.templatetags.ratelimit_dashboard import count, percent


def render(source: str, **context: Any) -> str:
    return Template("{% load ratelimit_dashboard %}" + source).render(Context(context))


@pytest.mark.parametrize(("value", "shown"), [
    (0, "0"), (999, "999"), (1000, "1,000"), (12345, "12,345"), (1234567890, "1,234,567,890"),
    (-4200, "-4,200"), ("12345", "12,345"), (12.9, "12"),
])
def test_count_separates_thousands(value: Any, shown: str) -> None:
    assert count(value) == shown
    assert render("{{ v|count }}", v=value) == shown


@pytest.mark.parametrize("value", [None, "n/a", "", "1.5", [3]])
def test_count_shows_what_is_not_a_number_as_it_is(value: Any) -> None:
    assert count(value) == str(value)


@pytest.mark.parametrize(("value", "shown"), [
    (0, "0.0%"), (0.1234, "12.3%"), (0.5, "50.0%"), (1, "100.0%"), ("0.25", "25.0%"), (0.00049, "0.0%"),
    (0.9996, "100.0%"),
])
def test_percent_shows_a_fraction_as_a_percentage_with_one_decimal(value: Any, shown: str) -> None:
    assert percent(value) == shown
    assert render("{{ v|percent }}", v=value) == shown


@pytest.mark.parametrize("value", [None, "-", "n/a", ""])
def test_percent_shows_what_is_not_a_number_as_it_is(value: Any) -> None:
    assert percent(value) == str(value)


def test_a_missing_variable_renders_empty_not_an_error() -> None:
    assert render("[{{ missing|count }}|{{ missing|percent }}]") == "[|]"
