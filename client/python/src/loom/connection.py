"""How the client reaches loomd: the address, TLS and the bearer token, resolved as loomctl does.

- server: the argument, else $LOOM_SERVER when set and not empty, else 127.0.0.1:7070.
- token: the argument, else the first line of `token_file` (or $LOOM_TOKEN_FILE), which must
  not be readable or writable by group or others, else $LOOM_TOKEN; none when nothing is set.
  It is sent as "authorization: Bearer TOKEN" metadata on every call, also over plaintext.
- TLS: with `ca` (else $LOOM_TLS_CA) the server is verified against that PEM bundle; with
  `cert`/`key` a client certificate is presented (mutual TLS). Without any of them: plaintext
  when `insecure` is set or the host is loopback (the local development default), otherwise
  TLS against the system's roots. `insecure` together with TLS files is an error.
"""

from __future__ import annotations

import ipaddress
import os
import stat
from dataclasses import dataclass
from typing import List, Optional, Tuple

import grpc

from loom.errors import FailedPrecondition, InvalidArgument

DEFAULT_SERVER = "127.0.0.1:7070"
# Large job lists and log pages: accept what loomd may send (as loomctl does).
MAX_RECEIVE_BYTES = 64 << 20


def resolve_server(server: Optional[str]) -> str:
    """The server address: `server`, else $LOOM_SERVER when not empty, else DEFAULT_SERVER."""
    if server:
        return server
    return os.environ.get("LOOM_SERVER") or DEFAULT_SERVER


def read_token_file(path: str, what: str) -> str:
    """The token in `path` (named `what` in errors): its first line, whitespace stripped.

    Raises FailedPrecondition when the file cannot be read, is open to group or others
    (chmod 600 it), or holds no token.
    """
    try:
        mode = os.stat(path).st_mode
    except OSError:
        raise FailedPrecondition(f'{what}: cannot stat "{path}"', field=what) from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise FailedPrecondition(
            f'{what}: "{path}" is readable or writable by group or others; chmod 600 it',
            field=what)
    try:
        with open(path, encoding="utf-8") as f:
            token = f.readline().strip()
    except (OSError, UnicodeDecodeError):
        raise FailedPrecondition(f'{what}: cannot read "{path}"', field=what) from None
    if not token:
        raise FailedPrecondition(f'{what}: "{path}" holds no token', field=what)
    return token


def resolve_token(token: Optional[str], token_file: Optional[str]) -> str:
    """The bearer token as loomctl finds it; "" when none is configured."""
    if token:
        return token
    path = token_file or os.environ.get("LOOM_TOKEN_FILE", "")
    if path:
        return read_token_file(path, "token_file" if token_file else "LOOM_TOKEN_FILE")
    return os.environ.get("LOOM_TOKEN", "")


def split_host_port(target: str) -> Tuple[str, int]:
    """HOST:PORT or [IPv6]:PORT; InvalidArgument naming `server` otherwise."""
    host, sep, port = target.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidArgument(
            f'server: "{target}" is not HOST:PORT; give e.g. 127.0.0.1:7070 or set LOOM_SERVER',
            field="server")
    return host, int(port)


def is_loopback_host(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and "localhost" (the hosts where plaintext is the default)."""
    if host in ("localhost", "::1"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.version == 4 and address.is_loopback


def _read_pem(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        raise FailedPrecondition(f'{what}: cannot read "{path}"; give a readable PEM file',
                                 field=what) from None
    if b"-----BEGIN " not in data[:4096]:
        raise FailedPrecondition(f'{what}: "{path}" is not a PEM file (no -----BEGIN line)',
                                 field=what)
    return data


@dataclass(frozen=True)
class Connection:
    """The resolved settings of a client: where, how (plaintext or TLS), and which token."""

    server: str
    channel: grpc.Channel
    token: str
    tls: bool

    def metadata(self) -> List[Tuple[str, str]]:
        """The call metadata: the bearer token when there is one."""
        return [("authorization", "Bearer " + self.token)] if self.token else []


def connect(server: Optional[str] = None, *, ca: Optional[str] = None, cert: Optional[str] = None,
            key: Optional[str] = None, token: Optional[str] = None,
            token_file: Optional[str] = None, insecure: bool = False) -> Connection:
    """Resolves the settings (see the module's docstring) and opens a channel (lazily: nothing
    is sent until the first call). Raises InvalidArgument or FailedPrecondition for bad settings.
    """
    target = resolve_server(server)
    host, _ = split_host_port(target)
    ca = ca or os.environ.get("LOOM_TLS_CA") or None
    if bool(cert) != bool(key):
        raise InvalidArgument("cert and key go together: give both or neither", field="cert")
    bearer = resolve_token(token, token_file)
    options = [("grpc.max_receive_message_length", MAX_RECEIVE_BYTES)]
    if not (ca or cert):
        if insecure or is_loopback_host(host):
            return Connection(target, grpc.insecure_channel(target, options=options), bearer, False)
        credentials = grpc.ssl_channel_credentials()
    else:
        if insecure:
            raise InvalidArgument("insecure contradicts ca/cert: give one or the other",
                                  field="insecure")
        credentials = grpc.ssl_channel_credentials(
            root_certificates=_read_pem(ca, "ca") if ca else None,
            private_key=_read_pem(key, "key") if key else None,
            certificate_chain=_read_pem(cert, "cert") if cert else None)
    return Connection(target, grpc.secure_channel(target, credentials, options=options), bearer,
                      True)
