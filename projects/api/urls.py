from django.urls import include, path

from projects.api import views

project_urls = [
    path("", views.ProjectDetailView.as_view(), name="project-detail"),
    path("members/", views.MemberListView.as_view(), name="members"),
    path("secrets/", views.SecretListView.as_view(), name="secrets"),
    path("secrets/<str:name>/", views.SecretDetailView.as_view(), name="secret-detail"),
    path("", include("runs.api.urls")),
    path("", include("instances.api.urls")),
    path("", include("events.api.urls")),
]

urlpatterns = [
    path("projects/", views.ProjectListView.as_view(), name="projects"),
    path("memberships/", views.MyMembershipListView.as_view(), name="my-memberships"),
    path("memberships/<str:project>/", views.MyMembershipDetailView.as_view(), name="my-membership"),
    path("projects/<str:project>/", include(project_urls)),
]
