"""Can the group's members reach the head on its ports? (``dfo hosts check --group``)

Runs as ``python -c SOURCE MODE ...`` on a member (any python3; standard library only).
Every finding is one line ``@dfo-port {json}`` on stdout.

``listen ADDR PORTS SECONDS EXPECTED`` (on the head): bind ADDR on each of PORTS
(comma-separated), print ``{"event": "bind", ...}`` per port and then
``{"event": "listening"}``; accept connections until every port had EXPECTED of them, a
client sent ``stop``, or SECONDS passed. Each accepted connection prints
``{"event": "accepted", "port": P, "peer": IP, "hello": TEXT}``.

``connect ADDR PORTS TIMEOUT HELLO`` (on every other member): connect to ADDR on each
port, send HELLO (``stop`` ends the listener), print ``{"event": "connect", "port": P,
"ok": BOOL, "error": TEXT, "errno": NAME}`` per port.
"""

import errno
import json
import select
import socket
import sys
import time


def say(**kw):
    sys.stdout.write("@dfo-port " + json.dumps(kw) + "\n")
    sys.stdout.flush()


def _family(addr):
    try:
        return socket.getaddrinfo(addr, None, 0, socket.SOCK_STREAM)[0][0]
    except OSError:
        return socket.AF_INET


def _errname(e):
    return errno.errorcode.get(getattr(e, "errno", None) or 0, type(e).__name__)


def listen(addr, ports, seconds, expected):
    socks = {}
    for port in ports:
        s = socket.socket(_family(addr), socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((addr, port))
            s.listen(16)
        except OSError as e:
            s.close()
            say(event="bind", port=port, ok=False, error=str(e.strerror or e), errno=_errname(e))
            continue
        say(event="bind", port=port, ok=True)
        socks[s] = port
    say(event="listening", ports=sorted(socks.values()))
    got = {p: 0 for p in socks.values()}
    deadline = time.monotonic() + seconds
    while socks and time.monotonic() < deadline and any(n < expected for n in got.values()):
        ready, _, _ = select.select(list(socks), [], [], max(0.0, min(1.0, deadline - time.monotonic())))
        for s in ready:
            try:
                c, peer = s.accept()
            except OSError:
                continue
            c.settimeout(2.0)
            try:
                hello = c.recv(200).decode("utf-8", "replace").strip()
            except OSError:
                hello = ""
            c.close()
            if hello == "stop":
                say(event="stopped")
                return
            got[socks[s]] += 1
            say(event="accepted", port=socks[s], peer=peer[0], hello=hello)
    say(event="done")


def connect(addr, ports, timeout, hello):
    for port in ports:
        try:
            c = socket.create_connection((addr, port), timeout=timeout)
        except OSError as e:
            reason = str(e.strerror or e) if not isinstance(e, socket.timeout) else "timed out"
            say(event="connect", port=port, ok=False, error=reason, errno=_errname(e))
            continue
        try:
            c.sendall(hello.encode("utf-8") + b"\n")
        except OSError:
            pass
        c.close()
        say(event="connect", port=port, ok=True)


def main(argv):
    mode, addr, ports = argv[0], argv[1], [int(p) for p in argv[2].split(",")]
    if mode == "listen":
        listen(addr, ports, float(argv[3]), int(argv[4]))
    elif mode == "connect":
        connect(addr, ports, float(argv[3]), argv[4])
    else:
        sys.exit("usage: listen|connect ...")


if __name__ == "__main__":
    main(sys.argv[1:])
