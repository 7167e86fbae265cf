from django.urls import path

from orgs import views

urlpatterns = [
    path("<slug:slug>/activity", views.activity, name="orgs-activity"),
]
