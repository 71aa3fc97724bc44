from django import template

from console import words

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
    busy = getattr(instance, "busy_jobs", None) or []
    return ", ".join(f"{j.run.name}/{j.node_group_name}/{j.node_group_rank}" for j in busy) or "-"
