"""`on_failure` and `max_restarts`: what a failed node of a group means for its run.

Written per group (or at the top of a `nodes:` task, for its one group). The shorthand
`on_failure: restart-group` is one rule that matches every failure; a list of rules is tried in
order and the first match wins (JobSet's failurePolicy). A failure no rule matches falls to the
run's `retry`, else it fails the run, as a run without `on_failure` always did.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import ValidationError

from .errors import ErrorList, from_validation_error
from .fields import CheckedModel, WrittenModel

Action = Literal["fail-run", "restart-group", "restart-run", "ignore"]
ACTIONS: tuple[str, ...] = get_args(Action)
# no-capacity is the run's to retry (it happens before a node exists): not a rule's event
RuleEvent = Literal["error", "interruption"]
DEFAULT_MAX_RESTARTS = 3
MAX_RESTARTS_LIMIT = 100
MAX_RULES = 32
MAX_EXIT_CODES = 64


class FailureRule(CheckedModel):
    on_events: list[RuleEvent]  # never empty once checked: an omitted list is every event
    on_exit_codes: list[int]  # empty: any exit status
    action: Action


class _RuleInput(WrittenModel):
    on_events: list[RuleEvent] | None = None
    on_exit_codes: list[int] | None = None
    action: Action


def read_policy(on_failure: Any, max_restarts: Any, loc: list[str | int], rank0: bool,
                errors: ErrorList) -> tuple[list[FailureRule], int]:
    """The group's rules and restart budget; every problem is added to `errors` under `loc`."""
    budget = _read_budget(max_restarts, [*loc, "max_restarts"], errors)
    if on_failure is None:
        return [], budget
    where = [*loc, "on_failure"]
    if isinstance(on_failure, str):
        if on_failure not in ACTIONS:
            errors.add(where, f"`{on_failure}` is not an action: use one of {', '.join(ACTIONS)}, or a list of rules")
            return [], budget
        raw: list[Any] = [{"action": on_failure}]
        locs = [where]
    elif isinstance(on_failure, list):
        if not on_failure or len(on_failure) > MAX_RULES:
            errors.add(where, f"list 1 to {MAX_RULES} rules like {{on_events: [error], action: restart-group}}")
            return [], budget
        raw, locs = on_failure, [[*where, i] for i in range(len(on_failure))]
    else:
        errors.add(where, f"use an action ({', '.join(ACTIONS)}) or a list of rules "
                          "{on_events: [error | interruption], on_exit_codes: [...], action: ...}")
        return [], budget
    rules = [rule for item, at in zip(raw, locs, strict=True)
             if (rule := _read_rule(item, at, rank0, errors)) is not None]
    return rules, budget


def _read_rule(item: Any, loc: list[str | int], rank0: bool, errors: ErrorList) -> FailureRule | None:
    try:
        rule = _RuleInput.model_validate(item)
    except ValidationError as exc:
        errors.extend_from(from_validation_error(exc, model=_RuleInput), loc)
        return None
    before = len(errors.items)
    if rule.on_events is not None and not rule.on_events:
        errors.add([*loc, "on_events"], "list at least one event (error, interruption), or leave on_events out")
    codes = rule.on_exit_codes
    if codes is not None:
        if not codes or len(codes) > MAX_EXIT_CODES or any(not 0 <= c <= 255 for c in codes):
            errors.add([*loc, "on_exit_codes"], f"list 1 to {MAX_EXIT_CODES} exit statuses, each 0..255")
        if rule.on_events is not None and "error" not in rule.on_events:
            errors.add([*loc, "on_exit_codes"], "exit statuses belong to `error` (a process that failed): "
                                                "add error to on_events or drop on_exit_codes")
    if rank0 and rule.action == "ignore":
        errors.add([*loc, "action"], "this group holds rank 0 (the master): its failure cannot be ignored; "
                                     "use fail-run, restart-run, or put the master in a group of its own")
    if len(errors.items) > before:
        return None
    events = rule.on_events or (["error"] if codes else list(get_args(RuleEvent)))
    return FailureRule(on_events=list(dict.fromkeys(events)), on_exit_codes=sorted(set(codes or [])),
                       action=rule.action)


def _read_budget(value: Any, loc: list[str | int], errors: ErrorList) -> int:
    if value is None:
        return DEFAULT_MAX_RESTARTS
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_RESTARTS_LIMIT:
        errors.add(loc, f"max_restarts is a whole number from 0 to {MAX_RESTARTS_LIMIT} (default "
                        f"{DEFAULT_MAX_RESTARTS}): how often the group may restart")
        return DEFAULT_MAX_RESTARTS
    return value
