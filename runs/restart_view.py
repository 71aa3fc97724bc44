"""A run's group restarts as its readers see them (the API, `muster apply` and `ps -v`, the console):
per group, how many so far out of how many allowed, why the last one happened, and while one is
pending, when it starts. The restarts themselves are the engine's (engine/restarts.py)."""

from __future__ import annotations

from datetime import datetime

from runs.configuration.failure_policy import DEFAULT_MAX_RESTARTS


def _group(run, index: int) -> dict:
    groups = (run.configuration or {}).get("groups") or []
    return groups[index] if 0 <= index < len(groups) and isinstance(groups[index], dict) else {}


def restarts(run) -> list[dict]:
    """One entry per group that restarted or is restarting, in group order: `group`, `restarts` (so
    far), `max_restarts`, `cause` (what the last restart is for), `upcoming` (not started yet),
    `starts_at` (when an upcoming one starts: its back-off's end), `backoff` (its seconds),
    `submission` (the submission its new jobs got, once started) and `with_group` (the group it
    restarts with, when that one's failure is the cause)."""
    shown = []
    for key, rec in sorted((run.restarts or {}).items(), key=lambda item: int(item[0])):
        index = int(key)
        group = _group(run, index)
        limit = group.get("max_restarts")
        upcoming = "started" not in rec
        due = rec.get("due")
        shown.append({
            "group": group.get("name", key), "restarts": int(rec.get("count", 0)),
            "max_restarts": DEFAULT_MAX_RESTARTS if limit is None else int(limit),
            "cause": rec.get("cause", ""), "upcoming": upcoming,
            "starts_at": datetime.fromisoformat(due) if upcoming and due else None,
            "backoff": rec.get("backoff"), "submission": rec.get("started"),
            # a group that restarts because the one it names the addresses of does (not a failure of its own)
            "with_group": _group(run, int(rec["follows"])).get("name", str(rec["follows"])) if "follows" in rec else None,
        })
    return shown


def count_by_group(run) -> dict[str, int]:
    return {entry["group"]: entry["restarts"] for entry in restarts(run)}
