"""QueueAdmin's dashboard and JSON API mounted under /ops/, beside the host's own admin site and
login pages."""

from django.contrib import admin
from django.contrib.staticfiles.urls import staticfiles_urlpatterns
from django.urls import include, path

urlpatterns = [
    path("ops/queues/", include("queues.urls")),
    path("ops/api/", include("queues.api.urls")),
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
]

# Static files from the installed apps while DEBUG is on (empty otherwise): uvicorn does not
# serve them the way runserver does.
urlpatterns += staticfiles_urlpatterns()
