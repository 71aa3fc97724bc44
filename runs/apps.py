from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"

    def ready(self) -> None:
        from django.db.models.signals import pre_delete

        from projects.models import Project
        from runs import log_storage
        from runs.models import Run

        # Every way a run goes (the API, a new run of its name, the admin, its project's deletion)
        # takes its logs with it: they may hold whatever secrets the job printed.
        pre_delete.connect(lambda instance, **_: log_storage.forget_run_on_commit(instance), sender=Run,
                           weak=False, dispatch_uid="runs.logs_go_with_the_run")
        pre_delete.connect(lambda instance, **_: log_storage.forget_project_on_commit(instance.pk), sender=Project,
                           weak=False, dispatch_uid="runs.logs_go_with_the_project")

        from runs import signals  # attach keys go when their member's access does

        signals.connect()
