from django.contrib import admin
from django.http import JsonResponse
from django.urls import include, path, re_path
from django.views import defaults
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from console.login import throttled
from console.metrics import metrics_view
from muster import disk, rows
from serving.views import to_endpoint

admin.site.site_header = "Muster administration"
admin.site.site_title = "Muster admin"
admin.site.index_title = "Operators' view (runs are submitted and changed through the API, the CLI or the console)"
admin.site.site_url = "/"


def healthz(request):
    rows.ping()
    full = disk.data_dir_full()
    if full:
        return JsonResponse({"ok": False, "reason": full}, status=503)
    return JsonResponse({"ok": True})


def not_found(request, exception):
    # an /api/ path no endpoint has: the API's one error shape (docs/api.md), not an HTML page
    if request.path.startswith("/api/"):
        return JsonResponse({"errors": [{"loc": [], "msg": f"no API endpoint at {request.path}: see /api/docs/"}]},
                            status=404)
    return defaults.page_not_found(request, exception)


handler404 = not_found

urlpatterns = [
    # ahead of admin.site.urls, so the admin's own log-in page is throttled like the console's
    path("admin/login/", throttled(admin.site.login)),
    path("admin/", admin.site.urls),
    path("healthz", healthz),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="swagger-ui"),
    path("api/", include("projects.api.urls")),
    # dstack's HTTP API, for the stock dstack CLI (docs/dstack-cli.md)
    path("dstack/", include("dstack_api.api.urls")),
    path("metrics", metrics_view, name="metrics"),
    # services are served by the endpoint, a process of its own (serving/proxy/): this sends clients there
    re_path(r"^proxy/services/", to_endpoint, name="service-proxy"),
    path("", include("console.urls")),
]
