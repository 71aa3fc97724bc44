"""Key text in and out: the private key a fleet holds, a host key as recorded, and fingerprints.

Keys are stored as text in the database and compared by people, so reading them, writing them
back and showing their fingerprint are one small job, apart from the connection that uses them.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io

import paramiko

from backends.ssh.errors import InvalidPrivateKey, SSHError

_KEY_CLASSES: tuple[type[paramiko.PKey], ...] = (paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey)


def load_private_key(text: str) -> paramiko.PKey:
    """Parse a private key from its text; encrypted keys are not supported (there is no one to ask)."""
    for cls in _KEY_CLASSES:
        try:
            return cls.from_private_key(io.StringIO(text))
        except paramiko.PasswordRequiredException as exc:
            raise InvalidPrivateKey(
                "the SSH private key is passphrase-protected; supply an unencrypted key"
            ) from exc
        except (paramiko.SSHException, ValueError, TypeError):
            continue
    raise InvalidPrivateKey(
        "the SSH private key could not be read: expected an unencrypted ed25519, ecdsa or rsa key "
        "in OpenSSH or PEM format"
    )


def parse_host_key(text: str) -> paramiko.PKey:
    """A host key recorded as "<keytype> <base64>" (an extra comment field is ignored)."""
    parts = text.split()
    if len(parts) < 2:
        raise SSHError(f"recorded host key {text!r} is not of the form '<keytype> <base64>'")
    try:
        return paramiko.PKey.from_type_string(parts[0], base64.b64decode(parts[1]))
    except (ValueError, paramiko.SSHException, binascii.Error) as exc:
        raise SSHError(f"recorded host key {text!r} cannot be parsed: {exc}") from exc


def format_host_key(key: paramiko.PKey) -> str:
    return f"{key.get_name()} {key.get_base64()}"


def fingerprint(key: paramiko.PKey | str) -> str:
    """The OpenSSH SHA256 fingerprint (`ssh-keygen -lf`), which is what a user can compare."""
    blob = key.asbytes() if isinstance(key, paramiko.PKey) else base64.b64decode(key.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")

