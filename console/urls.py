"""URLs: the console, the REST API under /api/v1, its schema and docs, and the admin."""

from csp.decorators import csp_update
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from drf_spectacular.views import (
    SpectacularAPIView,
    SpectacularRedocView,
    SpectacularSwaggerSplitView,
)
from rest_framework.routers import DefaultRouter

from console import metrics
from console import views as console_views
from fleet.api.urls import router as fleet_router
from rollouts.api.urls import extra_urls as rollouts_extra_urls
from rollouts.api.urls import router as rollouts_router

# One router, so the /api/v1/ index lists every endpoint.
api_router = DefaultRouter()
api_router.registry.extend([*fleet_router.registry, *rollouts_router.registry])
# Views outside the router (each app's extra_urls) come first.
api_v1 = [*rollouts_extra_urls, *api_router.urls]

urlpatterns = [
    path("", include("console.urls_console")),
    path("fleet/", include("fleet.urls")),
    path("registry/", include("rollouts.urls")),
    path("login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("api/v1/", include((api_v1, "api"), namespace="api")),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    # The split view serves Swagger UI's start-up script as a file: the page has no inline script.
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="api-schema"), name="api-docs"),
    # ReDoc builds its search index in a worker made from its own bundle (a blob: URL).
    path("api/redoc/", csp_update({"worker-src": ["'self'", "blob:"]})(
        SpectacularRedocView.as_view(url_name="api-schema")), name="api-redoc"),
    path("admin/", admin.site.urls),
    path("metrics", metrics.metrics, name="metrics"),
    path("favicon.ico", console_views.favicon, name="favicon"),
]

# Errors raised outside DRF's views: JSON under /api/, console pages elsewhere.
handler400 = "console.errors.bad_request"
handler403 = "console.errors.permission_denied"
handler404 = "console.errors.page_not_found"
handler500 = "console.errors.server_error"
