"""Sign in and out, and two-factor login. Logout is a POST (Django refuses GET), so a link
cannot sign anyone out."""

from django.contrib.auth import views as auth_views
from django.urls import include, path

urlpatterns = [
    path("login/", auth_views.LoginView.as_view(redirect_authenticated_user=True),
         name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", include("queues.web.two_factor_urls")),
]
