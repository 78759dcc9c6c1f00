#!/usr/bin/env python3
"""Count a client's requests in a kube-apiserver audit log (JSON lines,
Metadata level, as hack/local-up.sh writes with LOCAL_UP_AUDIT_LOG).

A client is picked by the start of its User-Agent (and optionally a
namespace); every request counts once (by auditID), whatever its verb.

  audit.py wait-converged LOG UA NS N TIMEOUT  wait until N Foos in NS got a status
                                               write from UA; print first-request
                                               and converged times (epoch seconds)
  audit.py quiet LOG UA SECONDS TIMEOUT        wait until UA has made no write for
                                               SECONDS; print the time it went quiet
  audit.py count LOG UA NS FROM TO             requests in [FROM, TO): total, then
                                               one line per verb and resource
"""
import datetime
import json
import sys
import time

WRITES = {"create", "update", "patch", "delete", "deletecollection"}


def ts(value):
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


class Log:
    """Follows the log as it grows; yields each request once, when complete
    (a watch when it starts)."""

    def __init__(self, path):
        self.file = open(path, encoding="utf-8")
        self.partial = ""
        self.seen = set()

    def new_requests(self):
        while True:
            chunk = self.file.readline()
            if not chunk:
                return
            if not chunk.endswith("\n"):
                self.partial += chunk
                continue
            line, self.partial = self.partial + chunk, ""
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("stage") not in ("ResponseComplete", "ResponseStarted", "Panic"):
                continue
            if event["auditID"] in self.seen:
                continue
            self.seen.add(event["auditID"])
            yield event


def matches(event, ua, ns=None):
    if not event.get("userAgent", "").startswith(ua):
        return False
    return ns is None or (event.get("objectRef") or {}).get("namespace") == ns


def resource(event):
    ref = event.get("objectRef") or {}
    name = ref.get("resource", event.get("requestURI", "?"))
    return name + ("/" + ref["subresource"] if ref.get("subresource") else "")


def ok(event):
    return 200 <= (event.get("responseStatus") or {}).get("code", 0) < 300


def wait_converged(path, ua, ns, n, timeout):
    log, first, done, deadline = Log(path), None, set(), time.time() + timeout
    while time.time() < deadline:
        for e in log.new_requests():
            if not matches(e, ua, ns):
                continue
            received = ts(e["requestReceivedTimestamp"])
            first = received if first is None else min(first, received)
            ref = e.get("objectRef") or {}
            if e["verb"] == "patch" and ref.get("subresource") == "status" and ok(e):
                done.add(ref.get("name"))
                if len(done) >= n:
                    print(f"{first:.6f} {ts(e['stageTimestamp']):.6f}")
                    return 0
        time.sleep(0.2)
    print(f"only {len(done)} of {n} Foos converged in {timeout}s", file=sys.stderr)
    return 1


def quiet(path, ua, seconds, timeout):
    log, last, deadline = Log(path), time.time(), time.time() + timeout
    while time.time() < deadline:
        for e in log.new_requests():
            if matches(e, ua) and e["verb"] in WRITES:
                last = max(last, ts(e["stageTimestamp"]))
        if time.time() - last >= seconds:
            print(f"{last:.3f}")
            return 0
        time.sleep(0.5)
    print(f"{ua} kept writing for {timeout}s", file=sys.stderr)
    return 1


def count(path, ua, ns, start, end):
    by_kind = {}
    for e in Log(path).new_requests():
        if matches(e, ua, ns or None) and start <= ts(e["requestReceivedTimestamp"]) < end:
            key = (e["verb"], resource(e))
            by_kind[key] = by_kind.get(key, 0) + 1
    print(sum(by_kind.values()))
    for (verb, res), n in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        print(f"{n} {verb} {res}")
    return 0


def main(argv):
    cmd, args = argv[1], argv[2:]
    if cmd == "wait-converged":
        return wait_converged(args[0], args[1], args[2], int(args[3]), float(args[4]))
    if cmd == "quiet":
        return quiet(args[0], args[1], float(args[2]), float(args[3]))
    if cmd == "count":
        return count(args[0], args[1], args[2], float(args[3]), float(args[4]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
