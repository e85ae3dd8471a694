"""Listening sockets localspec opens itself (a server's, a worker's), bound before anything loads:
a port in use is one line at once, not a failure after minutes of loading."""

import contextlib
import errno
import re
import socket
import ssl
from pathlib import Path

try:
    import resource
except ImportError:  # Windows
    resource = None

from .errors import UsageError


def url(host: str, port: int, tls: bool = False) -> str:
    """The OpenAI API base URL of a server listening on host:port (an IPv6 address in brackets)."""
    return f"http{'s' if tls else ''}://{f'[{host}]' if ':' in host else host}:{port}/v1"


def serving_tls(certificate: Path, key: Path) -> ssl.SSLContext:
    """A server's TLS from PEM files (llama-server's --ssl-cert-file and --ssl-key-file), checked before anything
    loads: UsageError saying why they do not make one."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(certificate, key)
    except ssl.SSLError as error:
        raise UsageError(f"--ssl-cert-file {certificate} and --ssl-key-file {key} are not a PEM certificate and its"
                         f" private key ({error.reason or error})") from None
    except OSError as error:
        raise UsageError(f"cannot read {error.filename or certificate}: {error.strerror}") from None
    return context


def trusting(certificate: str) -> ssl.SSLContext:
    """A client's TLS that trusts this certificate alone: a serve on this machine, by the certificate its record
    names (whatever host name the certificate was made for: it is reached at its listening address); the file's
    first certificate, the server's own, not the chain after it (which would trust all its issuer signs)."""
    text = Path(certificate).read_text()
    first = re.search(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", text, re.DOTALL)
    if first is None:
        raise ssl.SSLError(f"{certificate} holds no PEM certificate")
    context = ssl.create_default_context(cadata=first[0])
    context.check_hostname = False  # (the certificate is still verified: it must be this one)
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN  # a CA-signed certificate is trusted as itself
    return context


def listen(host: str, port: int) -> socket.socket:
    """A socket listening on host:port (0: any free port), or UsageError saying why it cannot be."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        return socket.create_server((host, port), family=family, dualstack_ipv6=False)
    except socket.gaierror as error:
        raise UsageError(f"cannot listen on {host}: {error.strerror}") from None
    except OSError as error:
        if error.errno == errno.EADDRINUSE:
            raise UsageError(f"cannot listen on {host}:{port}: port {port} on {host} is in use; choose another"
                             " with --port") from None
        raise UsageError(f"cannot listen on {host}:{port}: {error.strerror}") from None


def raise_open_file_limit() -> int | None:
    """Raise this process's soft limit of open files as far as the hard limit allows (every client
    connection is a file, and 1024 is a common soft limit); the soft limit now in force, or None where
    the system has no such limit (Windows)."""
    if resource is None:
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # macOS reports an infinite hard limit but refuses a soft one above its OPEN_MAX: ask for a finite one
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 2**16)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        with contextlib.suppress(ValueError, OSError):  # not allowed here: keep the limit there is
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]
