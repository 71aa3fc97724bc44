from django import template

from console import words
from instances.api.serializers import OTHER_PROJECTS_JOB

register = template.Library()


@register.filter
def health(instance) -> str:
    return words.health(instance)


@register.filter
def gpus(instance) -> str:
    return words.gpus(instance)


@register.filter
def docker(instance) -> str:
    return words.docker(instance)


@register.filter
def job_on(instance) -> str:
    """The jobs on the host; on a shared fleet's host, another project's job unnamed (as the API's
    instance list says it: never which run of another project holds it)."""
    busy = getattr(instance, "busy_jobs", None) or []
    return ", ".join(f"{j.run.name}/{j.node_group_name}/{j.node_group_rank}" if j.run.project_id == instance.project_id
                     else OTHER_PROJECTS_JOB for j in busy) or "-"
