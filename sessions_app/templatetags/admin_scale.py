"""A date hierarchy for changelists over millions of rows.

Django's own runs SELECT DISTINCT date_trunc(...) over every row of the list to find which
years, months or days have rows: a full scan. This one reads only the first and last date
(two ORDER BY ... LIMIT 1 reads from the ends of an index) and offers every year, month or
day between them; a link to an empty one shows an empty page."""

from __future__ import annotations

import calendar
import datetime
from typing import Any

from django import template
from django.contrib.admin.templatetags.base import InclusionAdminNode
from django.contrib.admin.utils import get_fields_from_path
from django.utils import formats, timezone
from django.utils.text import capfirst
from django.utils.translation import gettext as _

register = template.Library()


def _local(value: Any) -> Any:
    if isinstance(value, datetime.datetime) and timezone.is_aware(value):
        return timezone.localtime(value)
    return value


def _span(queryset, field_name: str) -> tuple[Any, Any]:
    """The first and last date of the list (which already holds the filters, the search
    and the picked year or month). Not MIN()/MAX(): PostgreSQL answers those from an
    index only for a query on one table; once a filter adds a join (an EXISTS) it reads
    every matching row. ORDER BY ... LIMIT 1 stops at the first match either way."""
    dated = queryset.filter(**{f"{field_name}__isnull": False}).values_list(field_name, flat=True)
    first = dated.order_by(field_name).first()
    last = dated.order_by(f"-{field_name}").first()
    return _local(first), _local(last)


def bounded_date_hierarchy(cl) -> dict[str, Any]:
    field_name = cl.date_hierarchy
    if not field_name:
        return {"show": False}
    get_fields_from_path(cl.model, field_name)  # fails loudly on a bad field name
    year_field, month_field, day_field = (
        f"{field_name}__year",
        f"{field_name}__month",
        f"{field_name}__day",
    )
    year, month, day = (cl.params.get(f) for f in (year_field, month_field, day_field))

    def link(filters: dict[str, Any]) -> str:
        return cl.get_query_string(filters, [f"{field_name}__"])

    if year and month and day:
        picked = datetime.date(int(year), int(month), int(day))
        return {
            "show": True,
            "back": {
                "link": link({year_field: year, month_field: month}),
                "title": capfirst(formats.date_format(picked, "YEAR_MONTH_FORMAT")),
            },
            "choices": [{"title": capfirst(formats.date_format(picked, "MONTH_DAY_FORMAT"))}],
        }

    first, last = _span(cl.queryset, field_name)
    if first is None or last is None:
        return {"show": False}
    if not year and first.year == last.year:
        year = first.year
        if first.month == last.month:
            month = first.month

    if year and month:
        y, m = int(year), int(month)
        lo = first.day if (first.year, first.month) == (y, m) else 1
        hi = last.day if (last.year, last.month) == (y, m) else calendar.monthrange(y, m)[1]
        return {
            "show": True,
            "back": {"link": link({year_field: year}), "title": str(year)},
            "choices": [
                {
                    "link": link({year_field: year, month_field: month, day_field: d}),
                    "title": capfirst(
                        formats.date_format(datetime.date(y, m, d), "MONTH_DAY_FORMAT")
                    ),
                }
                for d in range(lo, hi + 1)
            ],
        }
    if year:
        y = int(year)
        lo = first.month if first.year == y else 1
        hi = last.month if last.year == y else 12
        return {
            "show": True,
            "back": {"link": link({}), "title": _("All dates")},
            "choices": [
                {
                    "link": link({year_field: year, month_field: m}),
                    "title": capfirst(
                        formats.date_format(datetime.date(y, m, 1), "YEAR_MONTH_FORMAT")
                    ),
                }
                for m in range(lo, hi + 1)
            ],
        }
    return {
        "show": True,
        "back": None,
        "choices": [
            {"link": link({year_field: str(y)}), "title": str(y)}
            for y in range(first.year, last.year + 1)
        ],
    }


@register.tag(name="bounded_date_hierarchy")
def bounded_date_hierarchy_tag(parser, token):
    return InclusionAdminNode(
        parser,
        token,
        func=bounded_date_hierarchy,
        template_name="date_hierarchy.html",
        takes_context=False,
    )
