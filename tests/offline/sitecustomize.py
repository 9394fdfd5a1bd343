"""The test suite's network guard, loaded by every Python the tests start (conftest.py puts this folder first on
PYTHONPATH and sets SAGEGEN_TESTS_OFFLINE=1): a connection to anything but this machine raises. The tests build
everything offline; only `make lock` and `make test-latest` read the package index, outside the tests."""

import os
import socket

_LOCAL_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", ""}


class NetworkBlocked(OSError):
    pass


def _is_local(address) -> bool:
    if not isinstance(address, tuple):  # AF_UNIX paths and abstract names
        return True
    host = str(address[0]).split("%")[0].lower()
    return host in _LOCAL_NAMES or host.startswith("127.") or host in ("::1", "0.0.0.0", "::")


def install() -> None:
    if getattr(socket.socket.connect, "_sagegen_guard", False):
        return
    connect, connect_ex, getaddrinfo = socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo

    def refuse(address):
        raise NetworkBlocked(f"the tests are offline: a connection to {address!r} was refused "
                             f"(tests/offline/sitecustomize.py)")

    def guarded_connect(self, address):
        if not _is_local(address):
            refuse(address)
        return connect(self, address)

    def guarded_connect_ex(self, address):
        if not _is_local(address):
            refuse(address)
        return connect_ex(self, address)

    def guarded_getaddrinfo(host, *args, **kwargs):
        if not _is_local((host if isinstance(host, str) else (host or b"").decode(), 0)):
            refuse(host)
        return getaddrinfo(host, *args, **kwargs)

    guarded_connect._sagegen_guard = True
    socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo = (guarded_connect, guarded_connect_ex,
                                                                           guarded_getaddrinfo)


if os.environ.get("SAGEGEN_TESTS_OFFLINE") == "1":
    install()
