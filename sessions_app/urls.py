from django.urls import path

from . import views

app_name = "sessions"

urlpatterns = [
    path("", views.session_list, name="list"),
    path("<uuid:session_id>/", views.session_detail, name="detail"),
]
