from django.urls import path

from events.api import views

urlpatterns = [
    path("events/", views.EventListView.as_view(), name="events"),
]
