"""`${{ groups[i].nodes[j].IP_ADDRESS }}` references and `${{ run.args }}` in commands and env values.

These are the only interpolations the language has: any other `${{ ... }}` expression is rejected
at submit time rather than passed through, so a typo cannot reach a host as literal text.
`${{ run.args }}` is filled when the run is planned or submitted (`muster apply -f FILE -- ARGS`). `$${{`
writes a literal `${{`. Whitespace inside `${{ }}` and around brackets and dots is optional.
References stay in the stored commands; the engine substitutes them once the IPs are known.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

_OPENING = re.compile(r"\$?\$\{\{")
_REFERENCE = re.compile(
    r"^groups\s*\[\s*([0-9]+)\s*\]\s*\.\s*nodes\s*\[\s*([0-9]+)\s*\]\s*\.\s*([A-Za-z_][A-Za-z0-9_]*)$"
)
_RUN_ARGS = re.compile(r"^run\s*\.\s*args$")
_SECRET = re.compile(r"^secrets\s*\.\s*([A-Za-z0-9_][A-Za-z0-9_.-]*)$")
IP_ATTRIBUTE = "IP_ADDRESS"
REFERENCE_FORM = "${{ groups[i].nodes[j].IP_ADDRESS }}"


@dataclass(frozen=True)
class _Piece:
    start: int
    end: int
    kind: str  # "escape" | "reference" | "run_args" | "secret" | "invalid"
    name: str = ""  # the secret's name
    group: int = -1
    node: int = -1
    problem: str = ""


def _scan(text: str) -> Iterator[_Piece]:
    pos = 0
    while (m := _OPENING.search(text, pos)) is not None:
        if m.group(0).startswith("$$"):
            yield _Piece(m.start(), m.end(), "escape")
            pos = m.end()
            continue
        close = text.find("}}", m.end())
        if close < 0:
            yield _Piece(
                m.start(),
                len(text),
                "invalid",
                problem="`${{` is not closed with `}}` (write `$${{` for a literal `${{`)",
            )
            return
        end = close + 2
        yield _classify(text[m.end() : close].strip(), m.start(), end)
        pos = end


def _classify(inner: str, start: int, end: int) -> _Piece:
    written = f"${{{{ {inner} }}}}"
    if _RUN_ARGS.fullmatch(inner):
        return _Piece(start, end, "run_args")
    secret = _SECRET.fullmatch(inner)
    if secret is not None:
        return _Piece(start, end, "secret", name=secret.group(1))
    match = _REFERENCE.fullmatch(inner)
    if match is None:
        if inner.startswith("groups"):
            problem = f"cannot read `{written}`: write {REFERENCE_FORM}"
        else:
            problem = (
                f"`{written}` is not supported: only {REFERENCE_FORM}, ${{{{ run.args }}}} and "
                "${{ secrets.NAME }} (in env values) can be interpolated "
                "(write `$${{` for a literal `${{`)"
            )
        return _Piece(start, end, "invalid", problem=problem)
    if match.group(3) != IP_ATTRIBUTE:
        return _Piece(
            start,
            end,
            "invalid",
            problem=f"`{match.group(3)}` is not a node attribute in `{written}`: only {IP_ATTRIBUTE} is supported",
        )
    return _Piece(start, end, "reference", group=int(match.group(1)), node=int(match.group(2)))


def ip_references(text: str) -> list[tuple[int, int]]:
    """(group index, node index) of each IP reference in `text`, in order, each listed once."""
    seen: dict[tuple[int, int], None] = {}
    for piece in _scan(text):
        if piece.kind == "reference":
            seen.setdefault((piece.group, piece.node), None)
    return list(seen)


def substitute_ips(text: str, ips: dict[tuple[int, int], str]) -> str:
    """Fill every IP reference from `ips` and turn `$${{` into `${{`.

    A reference whose IP is missing raises KeyError: starting a node with a hole in its command
    line is worse than waiting.
    """
    out: list[str] = []
    pos = 0
    for piece in _scan(text):
        out.append(text[pos : piece.start])
        if piece.kind == "escape":
            out.append("${{")
        elif piece.kind == "reference":
            key = (piece.group, piece.node)
            if key not in ips:
                raise KeyError(f"no IP address known for groups[{key[0]}].nodes[{key[1]}]")
            out.append(ips[key])
        else:
            out.append(text[piece.start : piece.end])
        pos = piece.end
    out.append(text[pos:])
    return "".join(out)


def substitute_run_args(text: str, args: str) -> str:
    """Fill every `${{ run.args }}`; everything else, escapes included, stays for later.

    A `${{` inside the arguments is escaped, so an argument cannot become an IP reference.
    """
    out: list[str] = []
    pos = 0
    for piece in _scan(text):
        out.append(text[pos : piece.start])
        out.append(args.replace("${{", "$${{") if piece.kind == "run_args" else text[piece.start : piece.end])
        pos = piece.end
    out.append(text[pos:])
    return "".join(out)


def secret_names(text: str) -> list[str]:
    """Names of the project secrets `text` refers to as `${{ secrets.NAME }}` (dstack's syntax)."""
    return list(dict.fromkeys(p.name for p in _scan(text) if p.kind == "secret"))


def substitute_secrets(text: str, values: Mapping[str, str]) -> str:
    """Fill every `${{ secrets.NAME }}` from `values` (KeyError names a missing one); a `${{` in a
    secret's value is escaped, so a value cannot become a reference."""
    out: list[str] = []
    pos = 0
    for piece in _scan(text):
        out.append(text[pos : piece.start])
        if piece.kind == "secret":
            out.append(values[piece.name].replace("${{", "$${{"))
        else:
            out.append(text[piece.start : piece.end])
        pos = piece.end
    out.append(text[pos:])
    return "".join(out)


def reference_problems(
    text: str, groups: Sequence[tuple[str, int | None]] | None, secrets_allowed: bool = False
) -> list[str]:
    """What is wrong with the `${{ }}` expressions of `text`.

    `groups` lists (name, node count) in order, with None for a count that is itself invalid
    (its node indexes are then not checked); `groups=None` means the task uses `nodes`, where no
    group reference can resolve.
    """
    problems: list[str] = []
    for piece in _scan(text):
        if piece.kind == "invalid":
            problems.append(piece.problem)
        elif piece.kind == "secret" and not secrets_allowed:
            problems.append(f"`${{{{ secrets.{piece.name} }}}}` can only be used in env values")
        elif piece.kind == "reference":
            problem = _range_problem(piece.group, piece.node, groups)
            if problem:
                problems.append(problem)
    return problems


def _range_problem(group: int, node: int, groups: Sequence[tuple[str, int | None]] | None) -> str | None:
    ref = f"groups[{group}].nodes[{node}]"
    if groups is None:
        return f"{ref} refers to a node group, but this task has no `groups` (it uses `nodes`)"
    if group >= len(groups):
        return (
            f"{ref}: groups[{group}] does not exist; the task has {len(groups)} "
            f"group{'s' if len(groups) != 1 else ''} (indexes 0..{len(groups) - 1})"
        )
    name, size = groups[group]
    if size is not None and node >= size:
        return (
            f"{ref}: nodes[{node}] does not exist; group {group} ({name}) has {size} "
            f"node{'s' if size != 1 else ''} (indexes 0..{size - 1})"
        )
    return None
