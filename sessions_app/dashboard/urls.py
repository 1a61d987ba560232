import re

from django.urls import path, register_converter
from django.urls.converters import StringConverter

from . import alerts, teams, views
from .actions import ACTIONS, PREVIEWS

app_name = "sessions"


def _names_converter(names: list[str]) -> type[StringConverter]:
    """A path segment that is one of `names` and nothing else: an action that is not in
    actions.ACTIONS has no URL (a 404 before any view runs)."""
    return type(
        "ActionNameConverter", (StringConverter,), {"regex": "|".join(map(re.escape, names))}
    )


# The URL of every action and every preview comes from the table: /<id>/actions/<name>/,
# reversed as {% url 'sessions:action' session.id 'cancel' %}.
register_converter(_names_converter(list(ACTIONS)), "action")
register_converter(_names_converter(list(PREVIEWS)), "previewed")

urlpatterns = [
    path("", views.session_list, name="list"),
    path("counts/", views.status_counts, name="counts"),
    path("bulk/", views.bulk_action, name="bulk"),
    path("charts/", views.list_charts, name="charts"),
    path("attention/", views.attention, name="attention"),
    path("agents/", views.agents, name="agents"),
    path("costs/", views.costs, name="costs"),
    path("import/", views.session_import, name="import"),
    path("alerts/", alerts.alert_rules, name="alerts"),
    path("alerts/<int:rule_id>/", alerts.alert_rule, name="alert_rule"),
    path("alerts/<int:rule_id>/test/", alerts.alert_rule_test, name="alert_rule_test"),
    path("alerts/<int:rule_id>/switch/", alerts.alert_rule_switch, name="alert_rule_switch"),
    path("alerts/<int:rule_id>/delete/", alerts.alert_rule_delete, name="alert_rule_delete"),
    path("teams/", teams.teams, name="teams"),
    path("teams/tokens/<int:token_id>/revoke/", teams.team_token_revoke, name="team_token_revoke"),
    path("new/", views.session_new, name="new"),
    path("<uuid:session_id>/", views.session_detail, name="detail"),
    path("<uuid:session_id>/panel/", views.session_header, name="panel"),
    path("<uuid:session_id>/row/", views.session_row, name="row"),
    path("<uuid:session_id>/steps/", views.session_steps, name="steps"),
    path("<uuid:session_id>/timeline/", views.session_timeline, name="timeline"),
    path("<uuid:session_id>/usage/", views.session_usage, name="usage"),
    path("<uuid:session_id>/diff/", views.checkpoint_diff, name="diff"),
    path("<uuid:session_id>/export/", views.session_export, name="export"),
    path("<uuid:session_id>/operators/", views.operators, name="operators"),
    path("<uuid:session_id>/preview/<previewed:action>/", views.action_preview, name="preview"),
    path("<uuid:session_id>/actions/<action:action>/", views.session_action, name="action"),
]
