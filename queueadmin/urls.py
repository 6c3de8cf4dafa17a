from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("api/v1/", include("queues.api.urls")),
    path("accounts/", include("queues.web.auth_urls")),
    path("django-admin/", admin.site.urls),
    path("", include("queues.urls")),
]

# The database out of reach (or its pool exhausted) is a 503 the browser may retry, not a 500.
handler500 = "queues.web.unavailable.server_error"
