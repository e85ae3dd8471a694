"""Listening sockets localspec opens itself (a server's, a worker's), bound before anything loads:
a port in use is one line at once, not a failure after minutes of loading."""

import errno
import socket

from .errors import UsageError


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
