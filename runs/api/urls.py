from django.urls import path

from runs.api import views

urlpatterns = [
    path("runs/", views.RunListView.as_view(), name="runs"),
    path("runs/plan", views.RunPlanView.as_view(), name="run-plan"),
    path("runs/<str:name>/", views.RunDetailView.as_view(), name="run-detail"),
    path("runs/<str:name>/stop", views.RunStopView.as_view(), name="run-stop"),
    path("runs/<str:name>/logs", views.RunLogsView.as_view(), name="run-logs"),
    path("runs/<str:name>/attach", views.RunAttachView.as_view(), name="run-attach"),
]
