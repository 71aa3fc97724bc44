"""What tests/sshhosts.py builds its hosts with: commands, keys, files, waiting for sshd, and the
stand-in `nvidia-smi` a host with GPUs gets."""

from __future__ import annotations

import base64
import hashlib
import os
import shlex
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


def _run(args: Sequence[str], check: bool = True, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def _ed25519_keypair() -> tuple[str, str]:
    """(OpenSSH private key text, "ssh-ed25519 <base64>")."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    ).decode()
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )
    return private, public


def _fingerprint(public_key: str) -> str:
    blob = base64.b64decode(public_key.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def _write(path: Path, text: str, mode: int) -> None:
    path.write_text(text)
    path.chmod(mode)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _wait_for_ssh_banner(
    address: str, port: int, proc: subprocess.Popen[bytes], log: Path, timeout: float = 10
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"sshd for {address}:{port} exited with {proc.returncode}: {log.read_text()[-2000:]}"
            )
        try:
            with socket.create_connection((address, port), timeout=1) as sock:
                if sock.recv(4).startswith(b"SSH-"):
                    return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(
        f"sshd for {address}:{port} did not answer within {timeout} s: {log.read_text()[-2000:]}"
    )


_NVIDIA_SMI = r"""#!/bin/sh
# Test stand-in for nvidia-smi: answers --query-gpu/--format and -L for the GPUs listed below, with
# the same text a real driver prints.
GPUS='@GPUS@'
query=""; format=""
for a in "$@"; do
  case "$a" in
    --query-gpu=*) query=${a#--query-gpu=} ;;
    --format=*) format=${a#--format=} ;;
    -L|--list-gpus) echo "$GPUS" | while IFS='|' read -r i name mem uuid; do
        echo "GPU $i: $name (UUID: $uuid)"; done; exit 0 ;;
  esac
done
if [ -z "$query" ]; then
  echo "Muster test host: $(echo "$GPUS" | wc -l) GPU(s); query with --query-gpu=name,memory.total --format=csv,noheader"
  exit 0
fi
case "$format" in *csv*) ;; *) echo "Only CSV format is supported by this stand-in" >&2; exit 2 ;; esac
nounits=0; header=1
case "$format" in *nounits*) nounits=1 ;; esac
case "$format" in *noheader*) header=0 ;; esac
if [ $header = 1 ]; then
  out=""
  old_ifs=$IFS; IFS=,
  for f in $query; do
    case "$f" in
      memory.total) h="memory.total [MiB]" ;;
      *) h="$f" ;;
    esac
    out="${out:+$out, }$h"
  done
  IFS=$old_ifs
  echo "$out"
fi
echo "$GPUS" | while IFS='|' read -r i name mem uuid; do
  out=""
  old_ifs=$IFS; IFS=,
  for f in $query; do
    case "$f" in
      index) v="$i" ;;
      name|gpu_name) v="$name" ;;
      uuid|gpu_uuid) v="$uuid" ;;
      memory.total) if [ $nounits = 1 ]; then v="$mem"; else v="$mem MiB"; fi ;;
      driver_version) v="550.127.05" ;;
      count) v=$(echo "$GPUS" | wc -l) ;;
      *) echo "Field \"$f\" is not a valid field to query." >&2; exit 2 ;;
    esac
    out="${out:+$out, }$v"
  done
  IFS=$old_ifs
  echo "$out"
done
"""
