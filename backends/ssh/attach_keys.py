"""A user's attach key on a job's host: one line in the fleet user's authorized_keys that lets the
key forward to the job's ports and do nothing else, added for an attach and removed when the job
ends (runs/services/attach.py says when).

Each line ends with a marker naming the job, the grant and the user, so removal takes exactly those lines whatever
else the file holds, and both operations can be repeated safely.
"""

from __future__ import annotations

import re
import shlex

from django.conf import settings

from backends.ssh.runner_host import RunnerError, SSHRunnerHost

# Lines of authorized_keys are short; this bounds what one install may append.
MAX_LINE = 16 << 10


def authorized_keys_path() -> str:
    return settings.MUSTER["ATTACH_AUTHORIZED_KEYS"]


def path_expr(path: str) -> str:
    if path == "~" or path.startswith("~/"):
        return '"$HOME"' + shlex.quote(path[1:]) if path != "~" else '"$HOME"'
    return shlex.quote(path)


# Installs and removals of one file take turns where the host has flock(1): a removal rewrites the
# file, and a line appended meanwhile (another user's attach) would be lost. Best effort: after the
# wait, or without flock, the edit goes ahead (a lost line is a failed attach, never a kept one).
def _lock(host: SSHRunnerHost) -> str:
    wait = max(1, int(host.timeout / 2))  # within the command's own timeout
    return f'if command -v flock >/dev/null 2>&1; then exec 9>>"$P.muster-lock" && flock -w {wait} 9; fi; '


def install(host: SSHRunnerHost, path: str, line: str) -> None:
    """Append `line` unless it is there already; the file and its directory are made private."""
    if "\n" in line or len(line) > MAX_LINE:
        raise ValueError("an authorized_keys entry is one line")
    # A line appended after the caller gave up would have no caller to take it off again: past
    # half the SSH timeout the script appends nothing (the caller then marks its grant due).
    late = max(1, int(host.timeout / 2))
    # the line comes on stdin: no quoting of key material into a shell command
    script = (f'umask 077; S=$(date +%s); P={path_expr(path)}; mkdir -p "$(dirname "$P")" && {_lock(host)}touch "$P" && '
              'IFS= read -r L && { grep -qxF -- "$L" "$P" || '
              f'{{ [ $(($(date +%s) - S)) -le {late} ] || {{ echo "took over {late}s: not added" >&2; exit 3; }}; '
              'printf "%s\\n" "$L" >> "$P"; }; }')
    status, out, err = host._exec(f"sh -c {shlex.quote(script)}", stdin=line.encode() + b"\n")
    if status != 0:
        raise RunnerError(f"{host.target.where}: cannot add the attach key to {path}: "
                          f"{(err or out).decode(errors='replace').strip()[:300]}")


SAFE_NEEDLE = re.compile(r" ?muster-attach-[A-Za-z0-9@.+_-]{1,200}")


def remove(host: SSHRunnerHost, path: str, needles: list[str]) -> None:
    """Drop every line holding one of `needles` (fixed strings), keeping the file itself (its
    owner and mode)."""
    bad = [n for n in needles if not SAFE_NEEDLE.fullmatch(n)]
    if bad or not needles:
        raise ValueError(f"bad attach markers {bad!r}")
    patterns = " ".join(f"-e {shlex.quote(n)}" for n in needles)
    # sessions the key opened before stay up when its line goes: their forwarders go too
    # (`--grant <marker>` on their command line; needles are digits, letters and dashes)
    # ("[-]-grant": the pattern must not match this script's own command line)
    kills = "; ".join(f"pkill -f -- {shlex.quote('[-]-grant ' + n.strip())}" for n in needles)
    script = (f'umask 077; P={path_expr(path)}; [ -f "$P" ] || exit 0; {_lock(host)}T="$P.muster-$$"; '
              f'grep -vF {patterns} -- "$P" > "$T"; cat "$T" > "$P"; rm -f "$T"; '
              f'if command -v pkill >/dev/null 2>&1; then {kills}; fi; true')
    status, out, err = host._exec(f"sh -c {shlex.quote(script)}")
    if status != 0:
        raise RunnerError(f"{host.target.where}: cannot remove the attach key from {path}: "
                          f"{(err or out).decode(errors='replace').strip()[:300]}")
