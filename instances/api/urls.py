from django.urls import path

from instances.api import views

urlpatterns = [
    path("fleets/", views.FleetListView.as_view(), name="fleets"),
    path("fleets/<str:name>/", views.FleetDetailView.as_view(), name="fleet-detail"),
    path("instances/", views.InstanceListView.as_view(), name="instances"),
    path("instance-groups/", views.InstanceGroupListView.as_view(), name="instance-groups"),
    path("instance-groups/<str:name>/", views.InstanceGroupDetailView.as_view(), name="instance-group-detail"),
]
