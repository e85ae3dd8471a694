"""Listening sockets localspec opens itself (a server's, a worker's), bound before anything loads:
a port in use is one line at once, not a failure after minutes of loading."""

import contextlib
import errno
import socket

try:
    import resource
except ImportError:  # Windows
    resource = None

from .errors import UsageError


def url(host: str, port: int) -> str:
    """The OpenAI API base URL of a server listening on host:port (an IPv6 address in brackets)."""
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/v1"


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
