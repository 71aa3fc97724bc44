"""The throttled log-in views: the console's /login/ and the admin's /admin/login/."""

from __future__ import annotations

from functools import wraps

from django.contrib.auth import signals
from django.contrib.auth import views as auth_views
from django.shortcuts import render

from projects.services import login_throttle


def _mark_failed(sender, credentials=None, request=None, **kwargs):
    if request is not None:
        request.muster_login_failed = True


def _mark_logged_in(sender, request=None, user=None, **kwargs):
    if request is not None:
        request.muster_logged_in = True


# authenticate() and login() say what happened; the wrapper reads it off the request
signals.user_login_failed.connect(_mark_failed, dispatch_uid="muster-login-failed")
signals.user_logged_in.connect(_mark_logged_in, dispatch_uid="muster-logged-in")


def throttled(view):
    """`view` with a refusal (429, before the form checks any password) while the user name or
    the client address is locked, and the outcome of every other POST counted."""

    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if request.method != "POST":
            return view(request, *args, **kwargs)
        username = request.POST.get("username", "")
        address = request.META.get("REMOTE_ADDR", "")
        wait = login_throttle.retry_after(address, username)
        if wait:
            response = render(request, "console/login_locked.html", {"wait": wait}, status=429)
            response["Retry-After"] = str(wait)
            return response
        response = view(request, *args, **kwargs)
        if getattr(request, "muster_logged_in", False):
            login_throttle.succeeded(username)
        elif getattr(request, "muster_login_failed", False):
            login_throttle.failed(address, username)
        return response

    return wrapper


console_login = throttled(auth_views.LoginView.as_view(template_name="console/login.html"))
