"""dstack's API: every call a POST under /dstack/api/. Thin: bodies are checked by the serializers,
the work is in dstack_api/services, and every project is resolved by Muster's own access check."""

from __future__ import annotations

from django.http import HttpResponse
from drf_spectacular.utils import extend_schema
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from dstack_api.api import serializers as s
from dstack_api.services import access, errors, fleets, keys, render, runs
from dstack_api.services.errors import DstackError
from runs.services.submission import idempotency_key_of


def NULL() -> HttpResponse:  # noqa: N802
    """dstack's answer to a call with nothing to return: JSON null."""
    return HttpResponse(b"null", content_type="application/json")


class DstackView(APIView):
    authentication_classes = [access.BearerAuthentication, access.MissingCredentials]
    permission_classes = [IsAuthenticated]
    change = False  # a read, checked as the native API checks a GET; True: as a POST (no read-only)
    body = None  # the serializer of the request body

    def get_exception_handler(self):
        return errors.exception_handler

    def initial(self, request, *args, **kwargs):
        access.check_client_version(request.headers.get("X-API-VERSION"))
        super().initial(request, *args, **kwargs)
        self.project = access.project_for(request, kwargs["project"], self.change) if "project" in kwargs else None

    def data(self) -> dict:
        if self.body is None:
            return {}
        checked = self.body(data=self.request.data if self.request.data is not None else {})
        checked.is_valid(raise_exception=True)
        return checked.validated_data


@extend_schema(exclude=True)
class ProjectGetView(DstackView):
    def post(self, request, project):
        return Response(render.project_object(self.project, access.members_of(self.project), request.user))


@extend_schema(exclude=True)
class MyUserView(DstackView):
    def post(self, request):
        pair = keys.keypair_of(request.user)
        # dstack's design: the user's own private key, to the user, for the client's SSH (docs/dstack-cli.md);
        # the token is kept only as a hash, so `creds.token` is empty (the client has it already)
        return Response({**render.user_object(request.user, pair.public_key), "creds": {"token": ""},
                         "ssh_private_key": pair.private_key})


@extend_schema(exclude=True)
class RunListView(DstackView):
    body = s.RunListSerializer

    def post(self, request):
        d = self.data()
        return Response(runs.listed(request.user, d.get("project_name"), d["only_active"], d["limit"],
                                    d.get("prev_submitted_at"), d["ascending"]))


@extend_schema(exclude=True)
class RepoInitView(DstackView):
    change = True
    body = s.RepoInitSerializer

    def post(self, request, project):
        if self.data()["repo_info"].get("repo_type") != "virtual":
            raise DstackError("Muster runs no repository code: `repos:` and `files:` are not supported; "
                              "run from a directory without them (docs/dstack-cli.md)")
        return NULL()


@extend_schema(exclude=True)
class RunPlanView(DstackView):
    change = True
    body = s.RunSpecSerializer

    def post(self, request, project):
        d = self.data()
        return Response(runs.plan(self.project, request.user, d["run_spec"], d.get("max_offers") or 3))


@extend_schema(exclude=True)
class RunApplyView(DstackView):
    change = True
    body = s.ApplyRunSerializer

    def post(self, request, project):
        key = idempotency_key_of(request.headers)  # as on Muster's own submit; dstack's client sends none
        run, replayed = runs.apply(self.project, request.user, self.data()["plan"], key)
        return Response(run, headers={"Idempotent-Replayed": "true"} if replayed else None)


@extend_schema(exclude=True)
class RunGetView(DstackView):
    body = s.RunNameSerializer

    def post(self, request, project):
        return Response(runs.get(self.project, request.user, self.data()["run_name"]))


@extend_schema(exclude=True)
class RunStopView(DstackView):
    change = True
    body = s.RunNamesSerializer

    def post(self, request, project):
        d = self.data()
        runs.stop(self.project, request.user, d["runs_names"], d["abort"])
        return NULL()


@extend_schema(exclude=True)
class RunDeleteView(DstackView):
    change = True
    body = s.RunNamesSerializer

    def post(self, request, project):
        runs.delete(self.project, self.data()["runs_names"])
        return NULL()


@extend_schema(exclude=True)
class LogsPollView(DstackView):
    body = s.LogsPollSerializer

    def post(self, request, project):
        d = self.data()
        submission = str(d["job_submission_id"]) if d.get("job_submission_id") else ""
        return Response(runs.poll_logs(self.project, d["run_name"], submission, d.get("next_token")))


@extend_schema(exclude=True)
class FleetListView(DstackView):
    def post(self, request, project):
        return Response(fleets.listed(self.project))


@extend_schema(exclude=True)
class FleetGetView(DstackView):
    body = s.FleetNameSerializer

    def post(self, request, project):
        return Response(fleets.get(self.project, self.data()["name"]))


@extend_schema(exclude=True)
class FleetPlanView(DstackView):
    change = True
    body = s.FleetSpecSerializer

    def post(self, request, project):
        return Response(fleets.plan(self.project, request.user, self.data()["spec"]))


@extend_schema(exclude=True)
class FleetApplyView(DstackView):
    change = True
    body = s.ApplyFleetSerializer

    def post(self, request, project):
        return Response(fleets.apply(self.project, request.user, self.data()["plan"]["spec"]))


@extend_schema(exclude=True)
class FleetDeleteView(DstackView):
    change = True
    body = s.FleetNamesSerializer

    def post(self, request, project):
        fleets.delete(self.project, request.user, self.data()["names"])
        return NULL()


@extend_schema(exclude=True)
class FleetDeleteInstancesView(DstackView):
    change = True
    body = s.FleetInstancesSerializer

    def post(self, request, project):
        d = self.data()
        fleets.delete_instances(self.project, request.user, d["name"], d["instance_nums"])
        return NULL()
