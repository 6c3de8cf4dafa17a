from django.contrib import admin
from django.urls import path
from django.views.generic import RedirectView

urlpatterns = [
    # The dashboard replaces this redirect; until then Django's admin site shows the queues.
    path("", RedirectView.as_view(url="/django-admin/", permanent=False)),
    path("accounts/login/", RedirectView.as_view(url="/django-admin/login/", permanent=False)),
    path("django-admin/", admin.site.urls),
]
