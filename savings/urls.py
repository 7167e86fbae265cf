from django.urls import path

from savings import views

app_name = "savings"
urlpatterns = [
    path("clusters/<slug:cluster>/", views.savings_page, name="savings"),
    path("clusters/<slug:cluster>/savings.csv", views.savings_csv, name="savings_csv"),
]
