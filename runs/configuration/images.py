"""`image`: a Docker image reference, checked against Docker's own grammar (distribution/reference).

The reference ends up in the runner's `docker pull` and `docker create` argv: whatever Docker
would not read as one image (a leading `-`, spaces, uppercase) is refused at plan time with the
form to write, rather than failing, or being read as something else, on a host.

    reference := [registry[:port]/]path[:tag][@digest]
"""

from __future__ import annotations

import re

# distribution/reference: alphanumerics joined by `.`, `_`, `__` or dashes, lowercase only
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[0-9a-fA-F:.]+\])"
_REGISTRY = re.compile(rf"{_HOST}(?::[0-9]+)?")
_PATH = re.compile(rf"{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*")
_TAG = re.compile(r"[\w][\w.-]{0,127}", re.ASCII)
_DIGEST = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,128}")
NAME_MAX = 255  # Docker's limit on registry + path
FORM = "[registry[:port]/]path[:tag][@digest], e.g. ghcr.io/org/image:1.2 or ubuntu@sha256:<64 hex digits>"


def image_problem(image: str) -> str | None:
    """Why `image` is not an image reference Docker reads as one, or None when it is."""
    shown = _cut(image)
    if not image or image != image.strip() or any(c.isspace() for c in image):
        return f"`{shown}` is not an image reference: it is empty or has spaces; write {FORM}"
    if image.startswith("-"):
        return f"`{shown}` is not an image reference (it starts with `-`, as a command-line flag does); write {FORM}"
    rest, _, digest = image.partition("@")
    if digest and not _DIGEST.fullmatch(digest):
        return f"`{shown}`: the digest `{_cut(digest)}` is not `algorithm:hex`, e.g. sha256:<64 hex digits>"
    registry, path = _split_registry(rest)
    tag = ""
    last_slash = path.rfind("/")
    if ":" in path[last_slash + 1 :]:
        path, _, tag = path.rpartition(":")
        if not _TAG.fullmatch(tag):
            return (f"`{shown}`: the tag `{_cut(tag)}` is not a tag: letters, digits, `_`, `.` and `-`, "
                    "starting with a letter, digit or `_`, at most 128 characters")
    if registry and not _REGISTRY.fullmatch(registry):
        return f"`{shown}`: `{_cut(registry)}` is not a registry host[:port]; write {FORM}"
    if not _PATH.fullmatch(path):
        lower = "" if path == path.lower() else " (repository names are lowercase)"
        return (f"`{shown}`: `{_cut(path)}` is not a repository path{lower}: lowercase letters and digits, "
                f"joined by `.`, `_`, `__` or `-`, in components separated by `/`; write {FORM}")
    if len(registry) + len(path) + (1 if registry else 0) > NAME_MAX:
        return f"the image name is longer than Docker's limit of {NAME_MAX} characters"
    return None


def _cut(text: str) -> str:
    # an error names what was written, but never echoes a whole oversized value back
    return text if len(text) <= 80 else text[:80] + "..."


def _split_registry(rest: str) -> tuple[str, str]:
    """Docker's rule: the first component names a registry when it has a `.` or `:`, or is localhost."""
    first, sep, remainder = rest.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first, remainder
    return "", rest


def check_image(value: str | None) -> str | None:
    """A pydantic validator: the reference, or ValueError naming the form to write."""
    if value is not None:
        problem = image_problem(value)
        if problem:
            raise ValueError(problem)
    return value
