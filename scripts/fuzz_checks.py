"""Schemathesis hooks and checks of Muster's own contract, loaded by `make fuzz` (SCHEMATHESIS_HOOKS).

Beside schemathesis' not_a_server_error: every rejection of bad input (400, and 415 for a body
that is not JSON) carries {"errors": [{"loc": [...], "msg": "..."}]} with each loc a list of keys
and indexes and each msg a sentence, the shape docs/api.md promises.

Random project and object names would only ever reach the 404 of a lookup (the access matrix in
the suite covers those), so path parameters are mostly drawn from what the scratch server holds:
project `main`, the fleet `fuzz-local` and the run `fuzz-run` that scripts/fuzz.py creates first.
"""

from __future__ import annotations

import schemathesis
from hypothesis import strategies as st

KNOWN = {"project": ["main"], "name": ["fuzz-local", "fuzz-run"]}


@schemathesis.hook
def flatmap_path_parameters(ctx, parameters):
    if not parameters:
        return st.just(parameters)
    drawn = {key: st.sampled_from([*KNOWN[key], value] if key in KNOWN else [value])
             for key, value in parameters.items()}
    return st.fixed_dictionaries(drawn)

BAD_INPUT = (400, 415)


@schemathesis.check
def rejections_locate_the_problem(ctx, response, case):
    if response.status_code not in BAD_INPUT:
        return None
    try:
        body = response.json()
    except ValueError as exc:
        raise AssertionError(f"{response.status_code} without a JSON body: {response.text[:200]!r}") from exc
    if not isinstance(body, dict) or set(body) != {"errors"}:
        raise AssertionError(f"{response.status_code} body is not {{errors: [...]}}: {str(body)[:300]}")
    errors = body["errors"]
    if not isinstance(errors, list) or not errors:
        raise AssertionError(f"{response.status_code} with an empty or non-list `errors`: {errors!r}")
    for error in errors:
        if not isinstance(error, dict) or set(error) != {"loc", "msg"}:
            raise AssertionError(f"an error is not {{loc, msg}}: {error!r}")
        loc, msg = error["loc"], error["msg"]
        if not isinstance(loc, list) or not all(isinstance(p, str | int) and not isinstance(p, bool) for p in loc):
            raise AssertionError(f"loc is not a list of keys and indexes: {loc!r}")
        if not isinstance(msg, str) or not msg.strip():
            raise AssertionError(f"msg is not a sentence: {msg!r}")
    return None
