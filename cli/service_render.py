"""How the CLI shows a service: its URL and replicas, in the plan and in `ps`."""

from __future__ import annotations

from typing import Any


def service_text(run: dict[str, Any]) -> str:
    service = run.get("service")
    if not service:
        return ""
    replicas = service.get("replicas") or {}
    return f"{service.get('url')} ({replicas.get('ready', 0)}/{replicas.get('total', 0)} ready)"


def service_plan(plan: dict[str, Any]) -> str:
    """A service's plan head: its URL and each replica group's replicas."""
    lines = [f"Service {plan.get('run_name')}: {plan.get('service_url') or 'URL once named'}"]
    for name, r in (plan.get("replicas") or {}).items():
        span = f"{r['min']}" if r["min"] == r["max"] else f"{r['min']}..{r['max']}, starts with {r['desired']}"
        lines.append(f"  replica group {name}: {span} replica(s)")
    return "\n".join(lines)
