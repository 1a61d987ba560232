from django.urls import path

from . import views

app_name = "sessions"

urlpatterns = [
    path("", views.session_list, name="list"),
    path("counts/", views.status_counts, name="counts"),
    path("bulk/", views.bulk_action, name="bulk"),
    path("charts/", views.list_charts, name="charts"),
    path("attention/", views.attention, name="attention"),
    path("agents/", views.agents, name="agents"),
    path("costs/", views.costs, name="costs"),
    path("import/", views.session_import, name="import"),
    path("<uuid:session_id>/", views.session_detail, name="detail"),
    path("<uuid:session_id>/panel/", views.session_header, name="panel"),
    path("<uuid:session_id>/row/", views.session_row, name="row"),
    path("<uuid:session_id>/steps/", views.session_steps, name="steps"),
    path("<uuid:session_id>/timeline/", views.session_timeline, name="timeline"),
    path("<uuid:session_id>/usage/", views.session_usage, name="usage"),
    path("<uuid:session_id>/diff/", views.checkpoint_diff, name="diff"),
    path("<uuid:session_id>/export/", views.session_export, name="export"),
    path("<uuid:session_id>/preview/<str:action>/", views.action_preview, name="preview"),
    path("<uuid:session_id>/actions/<str:action>/", views.session_action, name="action"),
]
