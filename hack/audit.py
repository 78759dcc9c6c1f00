#!/usr/bin/env python3
"""Count a client's requests in a kube-apiserver audit log (JSON lines,
Metadata level, as hack/local-up.sh writes with LOCAL_UP_AUDIT_LOG).

A client is picked by the start of its User-Agent (and optionally a
namespace); every request counts once (by auditID), whatever its verb.

  audit.py wait-converged LOG UA NS N TIMEOUT  wait until N Foos in NS got a status
                                               write from UA; print first-request
                                               and converged times (epoch seconds)
  audit.py quiet LOG UA SECONDS TIMEOUT        wait until UA has made no write but
                                               Lease renewals for SECONDS; print the
                                               time it went quiet
  audit.py written LOG UA NS FROM TIMEOUT RESOURCE NAME...
                                               wait until UA wrote each named object
                                               in NS after FROM; print when the last
                                               of them was written
  audit.py count LOG UA NS FROM TO             requests in [FROM, TO): total, then
                                               one line per verb and resource
  audit.py curve LOG UA NS                     seconds from UA's first request in NS
                                               to each Foo's first status write, sorted
  audit.py edits LOG EDITOR UA NS FROM READY N TIMEOUT
                                               wait until each of the N Foos EDITOR
                                               patched in NS after FROM had its
                                               Deployment (named as the Foo) written
                                               by UA; print p50, p99 and max seconds
                                               from the edit or READY, the later, to
                                               the write, then the same from the edit
  audit.py records LOG UA NS USER              every request so far, one JSON line each
                                               (user, pod, at, verb, resource, subresource,
                                               name, code, dry_run); by User-Agent start, namespace
                                               and user (or impersonated user), "-" for any
  audit.py svg OUT TITLE LABEL=FILE[,FILE]...  draw curves (files of `curve`) as Foos
                                               converged over time; of several files
                                               for one label, the run that ended first
"""
import datetime
import json
import math
import sys
import time

POD_NAME_KEY = "authentication.kubernetes.io/pod-name"
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

    def new_requests(self, containing=None):
        """`containing`: skip lines without this text unparsed (fast)."""
        while True:
            chunk = self.file.readline()
            if not chunk:
                return
            if not chunk.endswith("\n"):
                self.partial += chunk
                continue
            line, self.partial = self.partial + chunk, ""
            if containing and containing not in line:
                continue
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


def status_write(e, ua, ns, first):
    """Folds request e into the client's first request time `first`; returns
    that, and the Foo whose status e wrote (None if it wrote none)."""
    if not matches(e, ua, ns):
        return first, None
    received = ts(e["requestReceivedTimestamp"])
    first = received if first is None else min(first, received)
    ref = e.get("objectRef") or {}
    # A patch (ours: a server-side apply) or an update (controller-runtime's
    # Status().Update).
    wrote = e["verb"] in ("patch", "update") and ref.get("subresource") == "status" and ok(e)
    return first, ref.get("name") if wrote else None


def wait_converged(path, ua, ns, n, timeout):
    log, first, done, deadline = Log(path), None, set(), time.time() + timeout
    while time.time() < deadline:
        for e in log.new_requests():
            first, foo = status_write(e, ua, ns, first)
            if foo is not None:
                done.add(foo)
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
            # A leader renews its Lease for ever: that is not work.
            if matches(e, ua) and e["verb"] in WRITES and resource(e) != "leases":
                last = max(last, ts(e["stageTimestamp"]))
        if time.time() - last >= seconds:
            print(f"{last:.3f}")
            return 0
        time.sleep(0.5)
    print(f"{ua} kept writing for {timeout}s", file=sys.stderr)
    return 1


def written(path, ua, ns, start, timeout, res, names):
    log, last, pending, deadline = Log(path), 0.0, set(names), time.time() + timeout
    while time.time() < deadline:
        for e in log.new_requests():
            name = (e.get("objectRef") or {}).get("name")
            if (matches(e, ua, ns) and e["verb"] in WRITES and resource(e) == res and ok(e)
                    and name in names and ts(e["requestReceivedTimestamp"]) >= start):
                pending.discard(name)
                last = max(last, ts(e["stageTimestamp"]))
        if not pending:
            print(f"{last:.6f}")
            return 0
        time.sleep(0.1)
    print(f"not written in {timeout}s: {sorted(pending)}", file=sys.stderr)
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


def curve(path, ua, ns):
    first, done = None, {}
    for e in Log(path).new_requests():
        first, foo = status_write(e, ua, ns, first)
        if foo is not None:
            done.setdefault(foo, ts(e["stageTimestamp"]))
    for t in sorted(done.values()):
        print(f"{t - first:.3f}")
    return 0


SVG_COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]


def nice_step(span, ticks=6):
    raw = span / ticks
    magnitude = 10 ** len(str(int(raw))) / 10 if raw >= 1 else 0.1
    return next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)


def ticks(maximum):
    """Round values from 0 to maximum, about six of them."""
    step, value = nice_step(maximum), 0.0
    while value <= maximum + 1e-9:
        yield value
        value += step


def pixels(points):
    """The points of a line at whole pixels, without the repeats and the
    middles of straight runs: 100 000 steps draw as the same few thousand
    points as 1000 do."""
    kept = []
    for p in ((round(px), round(py)) for px, py in points):
        if kept and p == kept[-1]:
            continue
        if len(kept) >= 2 and (kept[-2][0] == kept[-1][0] == p[0] or kept[-2][1] == kept[-1][1] == p[1]):
            kept[-1] = p
        else:
            kept.append(p)
    return kept


def svg(out, title, series):
    """A step plot, hand-written SVG (no plotting library on the machines)."""
    curves = []
    for label, files in series:
        runs = [[float(x) for x in open(f, encoding="utf-8").read().split()] for f in files]
        runs = [r for r in runs if r]
        if runs:
            curves.append((label, min(runs, key=lambda r: r[-1])))
    w, h, left, right, top, bottom = 720, 400, 70, 20, 40, 50
    t_max = max(c[-1] for _, c in curves)
    n_max = max(len(c) for _, c in curves)
    x = lambda t: left + (w - left - right) * t / t_max
    y = lambda n: h - bottom - (h - top - bottom) * n / n_max
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
             f'<rect width="{w}" height="{h}" fill="white"/>',
             f'<text x="{w / 2}" y="22" text-anchor="middle" font-size="14">{title}</text>']
    for t in ticks(t_max):
        parts.append(f'<line x1="{x(t):.1f}" y1="{top}" x2="{x(t):.1f}" y2="{h - bottom}" stroke="#eee"/>')
        parts.append(f'<text x="{x(t):.1f}" y="{h - bottom + 16}" text-anchor="middle">{t:g}</text>')
    for n in ticks(n_max):
        parts.append(f'<line x1="{left}" y1="{y(n):.1f}" x2="{w - right}" y2="{y(n):.1f}" stroke="#eee"/>')
        parts.append(f'<text x="{left - 6}" y="{y(n) + 4:.1f}" text-anchor="end">{n:g}</text>')
    parts.append(f'<text x="{(left + w - right) / 2}" y="{h - 12}" text-anchor="middle">seconds from the first request</text>')
    parts.append(f'<text transform="translate(16 {(top + h - bottom) / 2}) rotate(-90)" text-anchor="middle">Foos converged</text>')
    for i, (label, c) in enumerate(curves):
        points = [(0.0, 0)]
        for k, t in enumerate(c, 1):
            points += [(t, k - 1), (t, k)]
        path = " ".join(f"{px:.0f},{py:.0f}" for px, py in pixels((x(t), y(k)) for t, k in points))
        colour = SVG_COLOURS[i % len(SVG_COLOURS)]
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{path}"/>')
        # Bottom right: a rising curve is high there.
        ly, lx = h - bottom - 16 - 18 * (len(curves) - 1 - i), w - right - 330
        parts.append(f'<line x1="{lx}" y1="{ly}" x2="{lx + 24}" y2="{ly}" stroke="{colour}" stroke-width="2"/>')
        parts.append(f'<text x="{lx + 30}" y="{ly + 4}">{label}: {len(c)} Foos in {c[-1]:.2f} s</text>')
    parts.append("</svg>")
    with open(out, "w", encoding="utf-8") as f:
        f.write("\n".join(parts) + "\n")
    return 0


def quantiles(values):
    values = sorted(values)
    pick = lambda q: values[max(0, math.ceil(len(values) * q) - 1)]
    return f"{pick(0.5):.3f} {pick(0.99):.3f} {values[-1]:.3f}"


def edits(path, editor, ua, ns, start, ready, n, timeout):
    """Edit latency from the audit log alone: each Foo EDITOR patched, to the
    first write UA made of its Deployment after that patch."""
    log, edited, applied, deadline = Log(path), {}, {}, time.time() + timeout
    while time.time() < deadline:
        for e in log.new_requests(containing=ns):
            ref, at = e.get("objectRef") or {}, ts(e["requestReceivedTimestamp"])
            if at < start or not ok(e) or ref.get("namespace") != ns:
                continue
            name = ref.get("name")
            if matches(e, editor) and e["verb"] == "patch" and resource(e) == "foos":
                edited.setdefault(name, at)
            elif (matches(e, ua) and e["verb"] in WRITES and resource(e) == "deployments"
                  and name in edited and name not in applied):
                applied[name] = ts(e["stageTimestamp"])
        if len(edited) >= n and all(name in applied for name in edited):
            print(quantiles([applied[f] - max(t, ready) for f, t in edited.items()]),
                  quantiles([applied[f] - t for f, t in edited.items()]))
            return 0
        time.sleep(0.2)
    missing = sorted(set(edited) - set(applied))
    print(f"{len(edited)} edits seen, not applied in {timeout}s: {missing}", file=sys.stderr)
    return 1


def records(path, ua, ns, user):
    any_ = lambda v: v in ("-", "")
    hint = user if not any_(user) else ua if not any_(ua) else None
    for e in Log(path).new_requests(containing=hint):
        if not any_(ua) and not matches(e, ua):
            continue
        ref = e.get("objectRef") or {}
        if not any_(ns) and ref.get("namespace") != ns:
            continue
        as_user = e.get("impersonatedUser") or e.get("user") or {}
        who = as_user.get("username", "")
        if not any_(user) and user not in (who, (e.get("user") or {}).get("username")):
            continue
        # The pod a bound ServiceAccount token names (as the kubelet mounts it).
        pod = ((as_user.get("extra") or {}).get(POD_NAME_KEY) or [None])[0]
        print(json.dumps({
            "user": who, "pod": pod, "at": e["requestReceivedTimestamp"], "verb": e["verb"],
            "resource": ref.get("resource", ""), "subresource": ref.get("subresource"),
            "name": ref.get("name"), "code": (e.get("responseStatus") or {}).get("code"),
            "dry_run": "dryRun=All" in (e.get("requestURI") or ""),
        }))
    return 0


def main(argv):
    cmd, args = argv[1], argv[2:]
    if cmd == "wait-converged":
        return wait_converged(args[0], args[1], args[2], int(args[3]), float(args[4]))
    if cmd == "quiet":
        return quiet(args[0], args[1], float(args[2]), float(args[3]))
    if cmd == "written":
        return written(args[0], args[1], args[2], float(args[3]), float(args[4]), args[5], set(args[6:]))
    if cmd == "count":
        return count(args[0], args[1], args[2], float(args[3]), float(args[4]))
    if cmd == "curve":
        return curve(args[0], args[1], args[2])
    if cmd == "edits":
        return edits(*args[:4], float(args[4]), float(args[5]), int(args[6]), float(args[7]))
    if cmd == "records":
        return records(*argv[2:6])
    if cmd == "svg":
        series = [(spec.split("=", 1)[0], spec.split("=", 1)[1].split(",")) for spec in args[2:]]
        return svg(args[0], args[1], series)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
