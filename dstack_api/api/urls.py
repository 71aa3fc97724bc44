from django.urls import path

from dstack_api.api import views

# dstack's paths: no trailing slash, `projects/` for the project itself, `project/` for what is in it
urlpatterns = [
    path("api/projects/<str:project>/get", views.ProjectGetView.as_view(), name="dstack-project"),
    path("api/users/get_my_user", views.MyUserView.as_view(), name="dstack-my-user"),
    path("api/runs/list", views.RunListView.as_view(), name="dstack-runs"),
    path("api/project/<str:project>/repos/init", views.RepoInitView.as_view(), name="dstack-repo-init"),
    path("api/project/<str:project>/runs/get_plan", views.RunPlanView.as_view(), name="dstack-run-plan"),
    path("api/project/<str:project>/runs/apply", views.RunApplyView.as_view(), name="dstack-run-apply"),
    path("api/project/<str:project>/runs/get", views.RunGetView.as_view(), name="dstack-run"),
    path("api/project/<str:project>/runs/stop", views.RunStopView.as_view(), name="dstack-run-stop"),
    path("api/project/<str:project>/runs/delete", views.RunDeleteView.as_view(), name="dstack-run-delete"),
    path("api/project/<str:project>/logs/poll", views.LogsPollView.as_view(), name="dstack-logs"),
    path("api/project/<str:project>/fleets/list", views.FleetListView.as_view(), name="dstack-fleets"),
    path("api/project/<str:project>/fleets/get", views.FleetGetView.as_view(), name="dstack-fleet"),
    path("api/project/<str:project>/fleets/get_plan", views.FleetPlanView.as_view(), name="dstack-fleet-plan"),
    path("api/project/<str:project>/fleets/apply", views.FleetApplyView.as_view(), name="dstack-fleet-apply"),
    path("api/project/<str:project>/fleets/delete", views.FleetDeleteView.as_view(), name="dstack-fleet-delete"),
    path("api/project/<str:project>/fleets/delete_instances", views.FleetDeleteInstancesView.as_view(),
         name="dstack-fleet-delete-instances"),
]
