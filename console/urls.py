from django.contrib.auth import views as auth_views
from django.urls import path

from console import views
from console.login import console_login

app_name = "console"

urlpatterns = [
    path("login/", console_login, name="login"),
    path("logout/", auth_views.LogoutView.as_view(next_page="console:login"), name="logout"),
    path("", views.index, name="index"),
    path("projects/<str:project>/runs/<str:name>/", views.run_page, name="run"),
    path("projects/<str:project>/runs/<str:name>/status", views.run_status, name="run-status"),
    path("projects/<str:project>/runs/<str:name>/log", views.run_log, name="run-log"),
    path("projects/<str:project>/runs/<str:name>/log.txt", views.run_log_download, name="run-log-download"),
    path("projects/<str:project>/runs/<str:name>/stop", views.run_stop, name="run-stop"),
    path("projects/<str:project>/fleets/", views.fleets_page, name="fleets"),
]
