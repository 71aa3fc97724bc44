from django.urls import path
from django.views.decorators.debug import sensitive_post_parameters

from runs.api import views

# a form-encoded submission carries its configuration and env in POST: no error report shows them
_hidden = sensitive_post_parameters()

urlpatterns = [
    path("runs/", _hidden(views.RunListView.as_view()), name="runs"),
    path("queue/", views.QueueView.as_view(), name="queue"),
    path("runs/plan", _hidden(views.RunPlanView.as_view()), name="run-plan"),
    path("runs/<str:name>/", views.RunDetailView.as_view(), name="run-detail"),
    path("runs/<str:name>/stop", views.RunStopView.as_view(), name="run-stop"),
    path("runs/<str:name>/logs", views.RunLogsView.as_view(), name="run-logs"),
    path("runs/<str:name>/metrics", views.RunMetricsView.as_view(), name="run-metrics"),
    path("runs/<str:name>/attach", views.RunAttachView.as_view(), name="run-attach"),
    path("runs/<str:name>/ssh", views.RunSshView.as_view(), name="run-ssh"),
    path("runs/<str:name>/attach/<int:grant>", views.RunAttachStatusView.as_view(), name="run-attach-status"),
]
