"""Runs stored before a group's commands and env were kept once in the run's configuration.

Such a run's job rows each held their group's commands, env (masked keys left out and listed in the
row's `hidden_env`), image and ports in `spec`. They move into `configuration.groups[index]`, the
masked keys' names into `configuration.hidden_env`, and the rows keep their place and resources
only: the shape submission.py writes now, so the engine reads one shape (runs/configuration/stored.py).
Job rows of the old shape are rewritten once here instead of being told apart on every start.
"""

from django.db import migrations

GROUP_KEYS = ("commands", "env", "image", "ports")
MASK = "***"  # runs/services/submission.py's mask of a secret env value, as stored


def group_of_old_row(spec: dict, group: dict, index: int, name: str) -> dict:
    """The group as the current shape keeps it, from one old row of it (every row of a group held
    the same copy). The masked keys stay in the group's env as the mask, as a new submit stores them."""
    hidden = spec.get("hidden_env") or []
    env = {**{key: MASK for key in hidden}, **(spec.get("env") or {})}
    return {"name": name, "index": index, "nodes": spec.get("nodes_in_group", 1), **group,
            "commands": list(spec.get("commands") or []), "env": env, "image": spec.get("image"),
            "ports": list(spec.get("ports") or [])}


def current_shape(apps, schema_editor) -> None:
    Run = apps.get_model("runs", "Run")
    Job = apps.get_model("runs", "Job")
    old = Job.objects.filter(spec__has_key="commands")
    for run_id in old.values_list("run_id", flat=True).distinct().order_by("run_id"):
        run = Run.objects.get(pk=run_id)
        configuration = dict(run.configuration or {})
        groups = [dict(g) for g in configuration.get("groups") or []]
        hidden = set(configuration.get("hidden_env") or [])
        for job in old.filter(run_id=run_id).order_by("submission_num", "job_num"):
            index = job.node_group_index
            while len(groups) <= index:
                groups.append({})
            groups[index] = group_of_old_row(job.spec, groups[index], index, job.node_group_name)
            hidden.update(job.spec.get("hidden_env") or [])
            job.spec = {k: v for k, v in job.spec.items() if k not in (*GROUP_KEYS, "hidden_env")}
            job.save(update_fields=["spec"])
        configuration["groups"] = groups
        configuration["hidden_env"] = sorted(hidden)
        run.configuration = configuration
        run.save(update_fields=["configuration"])


class Migration(migrations.Migration):

    dependencies = [
        ("runs", "0012_attach_install"),
    ]

    operations = [
        migrations.RunPython(current_shape, migrations.RunPython.noop),
    ]
