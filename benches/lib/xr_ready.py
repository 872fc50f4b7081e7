"""Times XRs from their creation to `Ready=True` against a Kubernetes API
server, for benches/cluster.sh. Talks to the API directly (the admin
kubeconfig's client certificate, no kubectl process per step): one watch of
the XR kind sees each XR's Ready condition when the API server writes it;
beside it a poller lists the XRs every POLL seconds, as a `kubectl get`
loop would, to show what a poll adds to the figure.

    python3 benches/lib/xr_ready.py KUBECONFIG OUT.json COMPOSITION \
        --zero N --warm N --batch N [--metrics URL] [--core-metrics URL] \
        [--tree PID | --pids PID,...]

Each XR is deleted (and its deletion seen) before the next is made, so no
XR is left for core to re-reconcile every --poll-interval (that would call
the functions between samples). With --metrics (xfn host's), a `first`
sample (xfn pulls the packages at the first call), then each `zero`
sample waits until xfn runs no function server (`xfn_host_servers_running`
0: scaled to zero after --server-idle) before creating its XR; `warm`
samples follow one another at once; `batch` creates N XRs at once.
Memory (kB of Rss and Pss from smaps_rollup) of --tree (a process and its
descendants) or --pids (their sum) is read at `idle` (before the samples),
`warm` (right after the warm samples) and `after` (after the batch).
What each XR cost up to Ready is read from counters (see CORE): xfn's
calls, and core's RunFunction calls, reconciles and work-queue waits.
"""
import argparse
import json
import os
import re
import ssl
import statistics
import sys
import threading
import time
import urllib.request

GROUP, VERSION, PLURAL, KIND = "bench.xfn.io", "v1", "xbenches", "XBench"
NS = "default"


def kubeconfig(path):
    """(server, ca, cert, key) of the kubeconfig cluster.sh writes."""
    text = open(path).read()
    field = lambda k: re.search(rf"{k}: ([^,}}\s]+)", text).group(1).strip('"')
    return field("server"), field("certificate-authority"), field("client-certificate"), field("client-key")


class Api:
    def __init__(self, path):
        self.server, ca, cert, key = kubeconfig(path)
        self.context = ssl.create_default_context(cafile=ca)
        self.context.load_cert_chain(cert, key)
        self.base = f"{self.server}/apis/{GROUP}/{VERSION}/namespaces/{NS}/{PLURAL}"

    def call(self, method, url, body=None, timeout=30):
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(url, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        return urllib.request.urlopen(request, context=self.context, timeout=timeout)

    def list(self):
        return json.load(self.call("GET", self.base))

    def create(self, name, composition):
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND,
                "metadata": {"name": name, "namespace": NS},
                "spec": {"region": name, "crossplane": {"compositionRef": {"name": composition}}}}
        self.call("POST", self.base, body).read()

    def delete(self, name):
        self.call("DELETE", f"{self.base}/{name}").read()


def ready(xr):
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in xr.get("status", {}).get("conditions", []))


class Seen:
    """When each XR was created, first seen Ready (by the watch and by the
    poller) and seen deleted."""

    def __init__(self):
        self.lock = threading.Condition()
        self.created, self.watched, self.polled, self.gone = {}, {}, {}, set()

    def note(self, table, name, when):
        with self.lock:
            if name in self.created and name not in table:
                table[name] = when
            self.lock.notify_all()

    def wait(self, test, what, timeout=300):
        with self.lock:
            if not self.lock.wait_for(test, timeout):
                sys.exit(f"xr_ready: {what} not seen within {timeout} s")


def watch(api, seen, version):
    while True:
        url = f"{api.base}?watch=1&allowWatchBookmarks=false&resourceVersion={version}"
        try:
            stream = api.call("GET", url, timeout=3600)
            for line in stream:
                event = json.loads(line)
                obj = event["object"]
                if event["type"] == "ERROR":
                    break
                version = obj["metadata"]["resourceVersion"]
                name = obj["metadata"]["name"]
                if event["type"] == "DELETED":
                    with seen.lock:
                        seen.gone.add(name)
                        seen.lock.notify_all()
                elif ready(obj):
                    seen.note(seen.watched, name, time.monotonic())
        except OSError:
            time.sleep(0.1)


def poll(api, seen, interval):
    while True:
        time.sleep(interval)
        try:
            items = api.list()["items"]
        except OSError:
            continue
        now = time.monotonic()
        for xr in items:
            if ready(xr):
                seen.note(seen.polled, xr["metadata"]["name"], now)


def tree(pid):
    """pid and its descendants."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            ppid = stat[stat.rindex(")") + 2:].split()[1]
            children.setdefault(ppid, []).append(entry)
    found, todo = [], [str(pid)]
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(children.get(p, []))
    return found


def memory(pids):
    total = {"Rss": 0, "Pss": 0}
    for pid in pids:
        try:
            rollup = open(f"/proc/{pid}/smaps_rollup").read()
        except OSError:
            continue
        for field in total:
            m = re.search(rf"^{field}:\s+(\d+)", rollup, re.M)
            total[field] += int(m.group(1)) if m else 0
    total["processes"] = len(pids)
    total["commands"] = []
    for pid in pids:
        try:
            total["commands"].append(open(f"/proc/{pid}/comm").read().strip())
        except OSError:
            pass
    return total


def scrape(url):
    """(name, labels, value) of each sample of a Prometheus text page."""
    for line in urllib.request.urlopen(url, timeout=5).read().decode().splitlines():
        m = re.match(r"([a-z_:]+)(\{.*\})? (\S+)$", line)
        if m:
            yield m.group(1), m.group(2) or "", float(m.group(3))


def servers_running(url):
    return sum(v for name, _, v in scrape(url) if name == "xfn_host_servers_running")


# What the figures are made of, as counters: xfn's calls (its metrics), and
# from core's: its RunFunction calls and their seconds (as core timed them),
# and its reconciles of the XR kind, their seconds and their wait in the
# work queue.
CORE = {"fn_calls": "function_run_function_seconds_count", "fn_seconds": "function_run_function_seconds_sum",
        "reconciles": "controller_runtime_reconcile_time_seconds_count",
        "reconcile_seconds": "controller_runtime_reconcile_time_seconds_sum",
        "queue_seconds": "workqueue_queue_duration_seconds_sum"}


def totals(xfn, core):
    out = {}
    if xfn:
        out["xfn_calls"] = sum(v for name, _, v in scrape(xfn) if name == "xfn_host_calls_total")
    if core:
        for name, labels, value in scrape(core):
            for key, metric in CORE.items():
                if name == metric and (key.startswith("fn_") or PLURAL in labels):
                    out[key] = out.get(key, 0) + value
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("kubeconfig")
    p.add_argument("out")
    p.add_argument("composition")
    p.add_argument("--zero", type=int, default=0)
    p.add_argument("--warm", type=int, default=10)
    p.add_argument("--batch", type=int, default=10)
    p.add_argument("--poll", type=float, default=1.0)
    p.add_argument("--metrics")
    p.add_argument("--core-metrics")
    p.add_argument("--tree", type=int)
    p.add_argument("--pids")
    a = p.parse_args()
    api = Api(a.kubeconfig)
    pids = lambda: tree(a.tree) if a.tree else a.pids.split(",")
    seen = Seen()
    for xr in api.list()["items"]:
        sys.exit(f"xr_ready: XR {xr['metadata']['name']} exists already")
    version = api.list()["metadata"]["resourceVersion"]
    threading.Thread(target=watch, args=(api, seen, version), daemon=True).start()
    threading.Thread(target=poll, args=(api, seen, a.poll), daemon=True).start()
    result = {"memory": {}, "samples": {}, "load": {}}
    loadavg = lambda: " ".join(open("/proc/loadavg").read().split()[:3])

    def one(name):
        with seen.lock:
            seen.created[name] = time.monotonic()
        api.create(name, a.composition)

    count = lambda: totals(a.metrics, a.core_metrics)

    def finish(names, counted, before):
        """Waits for `names` Ready, then deleted; adds to `counted` what
        the counters of `count` rose by from `before` up to Ready."""
        seen.wait(lambda: all(n in seen.watched for n in names), f"{names} Ready")
        at_ready = count()
        counted.append({k: v - before.get(k, 0) for k, v in at_ready.items()})
        seen.wait(lambda: all(n in seen.polled for n in names), f"{names} polled Ready")
        for n in names:
            api.delete(n)
        seen.wait(lambda: all(n in seen.gone for n in names), f"{names} deleted")
        return [{"watch": seen.watched[n] - seen.created[n], "poll": seen.polled[n] - seen.created[n]}
                for n in names]

    def tally(kind, counted, xrs):
        keys = counted[0].keys() if counted else []
        result.setdefault("counts", {})[kind] = {k: sum(c[k] for c in counted) / xrs for k in keys}

    def phase(kind, names, first=None):
        result["load"][kind] = loadavg()
        out, counted = [], []
        for name in names:
            if first:
                first()
            start = count()
            one(name)
            out.extend(finish([name], counted, start))
        result["samples"][kind] = out
        tally(kind, counted, len(names))

    def scaled_to_zero():
        deadline = time.monotonic() + 300
        while servers_running(a.metrics) > 0:
            if time.monotonic() > deadline:
                sys.exit("xr_ready: xfn host never scaled to zero")
            time.sleep(0.2)
        result["memory"]["zero"] = memory(pids())

    result["memory"]["idle"] = memory(pids())
    tag = a.composition
    if a.zero and a.metrics:
        # The host pulls a package at its function's first call.
        phase("first", [f"{tag}-first"])
        phase("zero", [f"{tag}-zero-{i}" for i in range(a.zero)], scaled_to_zero)
    phase("warm", [f"{tag}-warm-{i}" for i in range(a.warm + 1)])
    # The first warm sample only warms up (after a zero sample, or the
    # native servers' first connection): dropped.
    result["samples"]["warm"] = result["samples"]["warm"][1:]
    result["memory"]["warm"] = memory(pids())
    result["load"]["batch"] = loadavg()
    names = [f"{tag}-batch-{i}" for i in range(a.batch)]
    before, counted = count(), []
    started = time.monotonic()
    for name in names:
        one(name)
    result["samples"]["batch"] = finish(names, counted, before)
    tally("batch", counted, len(names))
    result["batch_all"] = max(seen.watched[n] for n in names) - started
    result["memory"]["after"] = memory(pids())
    result["load"]["end"] = loadavg()
    json.dump(result, open(a.out, "w"), indent=1)
    for kind, samples in result["samples"].items():
        w = [s["watch"] * 1000 for s in samples]
        q = [s["poll"] * 1000 for s in samples]
        print(f"{tag} {kind}: watch median {statistics.median(w):.0f} ms of {' '.join(f'{v:.0f}' for v in w)}; "
              f"poll {a.poll:g} s median {statistics.median(q):.0f} ms", file=sys.stderr)


main()
