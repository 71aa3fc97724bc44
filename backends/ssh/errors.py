"""What can go wrong talking to a host over SSH, one class per thing the user can fix.

Kept apart from the code that raises them so that every layer (connecting, key handling, running
commands, the runner host and the instances app) can catch and show the same family of errors
without importing paramiko-facing code. Each message names the host, the port and what to check,
so the instances app can show it as-is.
"""

from __future__ import annotations

from backends.base import BackendError


class SSHError(BackendError):
    """Any failure to talk to a host over SSH.

    A BackendError, so the engine's handlers (which catch BackendError around every runner call)
    see an unreachable host as a backend failure instead of letting the exception kill the task.
    """


class HostUnreachable(SSHError):
    """Nothing answers SSH at the address: refused, timed out, no route, or the connection dropped."""

    reason = "instance_unreachable"


class AuthenticationFailed(SSHError):
    """The host answered but did not accept the user with this key."""


class HostKeyMismatch(SSHError):
    """The host presented a different host key from the one recorded for it."""


class InvalidPrivateKey(SSHError):
    """The private key text cannot be read as an ed25519, ecdsa or rsa key."""


class SSHCommandTimeout(SSHError):
    """A remote command did not finish within its timeout."""


class OutputTooLarge(SSHError):
    """A remote command printed more than the output limit; its channel was closed."""


class HostNotAllowed(SSHError):
    """The operator's fleet host policy does not allow connecting to this address."""

