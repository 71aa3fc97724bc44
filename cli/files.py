"""Reading the files `muster apply` is given: YAML documents, env values, SSH key files."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from cli.client import CliError, UsageError
from cli.strict_yaml import StrictLoader

# ---- reading configuration files ----------------------------------------------------------------


def read_document(path: str) -> tuple[str, dict[str, Any]]:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        doc = yaml.load(text, Loader=StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        raise CliError(f"{path}: {yaml_problem(exc)}") from None
    except yaml.YAMLError as exc:
        raise CliError(f"{path}: invalid YAML: {exc}") from None
    if not isinstance(doc, dict):
        raise CliError(f"{path}: the configuration must be a mapping (type: task or type: fleet)")
    found = command_read_as_mapping(text)
    if found is not None:
        line, command = found
        raise CliError(f"{path}: line {line}: the command `{command}` holds `: `, so YAML reads it as a mapping, "
                       f"not a command: quote the command, e.g. - \"{command}\"")
    return text, doc


COMMAND_LISTS = ("commands", "setup")


def command_read_as_mapping(text: str) -> tuple[int, str] | None:
    """(line, the command as written) of the first item of a `commands:` list that YAML read as a
    one-key mapping: `- echo a: b` is {"echo a": "b"}, which the server refuses as "expected a
    string" without the line or the cause."""
    stack = [yaml.compose(text, Loader=StrictLoader)]  # noqa: S506 - a SafeLoader subclass
    while stack:
        node = stack.pop()
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.value in COMMAND_LISTS \
                        and isinstance(value, yaml.SequenceNode):
                    for item in value.value:
                        if isinstance(item, yaml.MappingNode) and len(item.value) == 1 and all(
                                isinstance(part, yaml.ScalarNode) for part in item.value[0]):
                            first, second = item.value[0]
                            return item.start_mark.line + 1, f"{first.value}: {second.value}"
                stack.append(value)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
    return None


def yaml_problem(exc: yaml.MarkedYAMLError) -> str:
    """One line, where an editor finds it: PyYAML's own message spans lines and repeats the text."""
    mark = exc.problem_mark or exc.context_mark
    problem = exc.problem or exc.context or "invalid YAML"
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""  # PyYAML counts from 0
    context = ""
    if exc.context and exc.problem and exc.context_mark and exc.context_mark is not mark:
        context = f" ({exc.context} from line {exc.context_mark.line + 1})"
    return f"{where}invalid YAML: {problem}{context}"


def parse_env_args(items: list[str] | None) -> dict[str, str]:
    values: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--env {item!r}: expected KEY=VALUE")
        values[key] = value
    return values


def _bare_keys(env: object) -> list[str]:
    if isinstance(env, list):
        return [item.strip() for item in env if isinstance(item, str) and "=" not in item]
    if isinstance(env, dict):
        return [str(k) for k, v in env.items() if v is None]
    return []


def bare_env_keys(doc: Mapping[str, Any]) -> list[str]:
    """Keys written without a value, at the top level and in every group."""
    keys = _bare_keys(doc.get("env"))
    for group in doc.get("groups") or []:
        if isinstance(group, dict):
            keys += _bare_keys(group.get("env"))
    return list(dict.fromkeys(keys))


def env_values(doc: Mapping[str, Any], given: Mapping[str, str], environ: Mapping[str, str]) -> dict[str, str]:
    """--env values, plus each bare key found in the local environment (--env wins).

    Only bare keys are taken from the environment: the rest of it is none of the server's business.
    """
    local = {key: environ[key] for key in bare_env_keys(doc) if key in environ}
    return {**local, **given}


def _read_key(path: str, base: Path, loc: str) -> str:
    key_path = Path(path).expanduser()
    if not key_path.is_absolute():
        # Like docker compose: a relative path means relative to the file that wrote it, so a
        # fleet file works from any working directory.
        key_path = base / key_path
    try:
        return key_path.read_text()
    except OSError as exc:
        raise CliError(f"{loc}: cannot read {key_path}: {exc.strerror or exc}") from None


def _inline_key(section: dict[str, Any], base: Path, loc: str) -> bool:
    if "identity_file" not in section:
        return False
    section["private_key"] = _read_key(str(section.pop("identity_file")), base, f"{loc}.identity_file")
    return True


def inline_identity_files(doc: dict[str, Any], base: Path) -> bool:
    """Replace every ssh_config identity_file with the key's content (the server never sees client
    paths). Changes `doc` in place; True when something was replaced."""
    ssh = doc.get("ssh_config")
    if not isinstance(ssh, dict):
        return False
    changed = _inline_key(ssh, base, "ssh_config")
    for i, host in enumerate(ssh.get("hosts") or []):
        if isinstance(host, dict):
            changed = _inline_key(host, base, f"ssh_config.hosts[{i}]") or changed
    return changed
