#!/usr/bin/env python3
"""Flow export end to end, counted at the collector: each exporter reads a capture (in the
page cache) and sends IPFIX to a fresh nfcapd on loopback (`-B`, the large socket buffer
its users set for bursts); a run's time is from the exporter's start until nfcapd has read
every datagram (its socket's queue empty after the exporter exits), and nfdump then reads
back what nfcapd wrote. nfpcapd is its own collector: its time is its run, its files are
read the same way. Run by scripts/compare-flow-exporters.sh, which builds and makes the
traces; arguments: the stateplane binary, the work folder, rounds, the CSV to write (or
-), then NAME=FILE:PACKETS for each trace.

Fails unless, for every stateplane run with pacing, nfdump finds every packet of the trace
and exactly the records the exporter counted, with 0 sequence failures. The peers' and the
unpaced run's losses are reported, not fatal (they are what is being compared).
"""
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import time

bin_, work, rounds, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
traces = []
for arg in sys.argv[5:]:
    name, rest = arg.split("=", 1)
    path, packets = rest.rsplit(":", 1)
    traces.append((name, path, int(packets)))

# Name, command (TRACE and PORT filled in), whether it must deliver every record (our
# paced runs), and whether it is its own collector. Flow tables as large as softflowd's
# (-m 1048576): the long trace holds 430,000 flows at once, and a full table exports flows
# early (ours by default holds 262,144 per worker and family).
SP = f"{bin_} flows -i TRACE --ipfix 127.0.0.1:PORT --max-flows 1048576 --summary-json"
EXPORTERS = [
    ("softflowd", "softflowd -r TRACE -n 127.0.0.1:PORT -v 10 -6 -m 1048576 -d -p sf.pid -c sf.ctl", False, False),
    ("nfpcapd", "nfpcapd -r TRACE -w nfp -e 1800,15", False, True),
    ("stateplane-1w", f"{SP} --workers 1", True, False),
    ("stateplane-2w", f"{SP} --workers 2", True, False),
    # What auto gives a collector on another host, whose queue cannot be read.
    ("stateplane-2w-28M", f"{SP} --workers 2 --ipfix-rate 28M", True, False),
    # Unpaced, as the peers send: how much of it nfcapd keeps.
    ("stateplane-2w-unpaced", f"{SP} --workers 2 --ipfix-rate 0", False, False),
]


def fail(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(1)


def queued(port):
    """nfcapd's socket queue in bytes and its drops, from /proc/net/udp (None: no socket)."""
    want = f":{port:04X}"
    with open("/proc/net/udp") as f:
        for line in f.readlines()[1:]:
            cols = line.split()
            if cols[1].endswith(want):
                return int(cols[4].split(":")[1], 16), int(cols[-1])
    return None


def start_nfcapd(folder):
    """A fresh nfcapd with a 32 MiB buffer (as large as the system allows) on a free port."""
    os.makedirs(folder)
    for _ in range(20):
        port = 20000 + int.from_bytes(os.urandom(2), "big") % 20000
        if queued(port) is not None:
            continue
        p = subprocess.Popen(["nfcapd", "-w", folder, "-p", str(port), "-b", "127.0.0.1",
                              "-B", "33554432"], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        for _ in range(50):
            if queued(port) is not None:
                return p, port
            time.sleep(0.1)
        p.kill()
    fail("nfcapd did not start")


def nfdump_totals(folder):
    """Flows, packets and sequence failures in nfdump's summary of what a collector wrote."""
    text = subprocess.run(["nfdump", "-R", folder, "-I"], capture_output=True, text=True).stdout
    got = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        got[key.strip()] = value.strip()
    try:
        return int(got["Flows"]), int(got["Packets"]), int(got["Sequence failures"])
    except (KeyError, ValueError):
        fail(f"nfdump could not read {folder}:\n{text}")


def run(exporter, trace, packets, round_, tag):
    name, cmd, must_deliver, own_collector = exporter
    folder = os.path.join(work, f"{tag}-{name}-{round_}")
    collector = None
    if own_collector:
        subprocess.run(["rm", "-rf", os.path.join(work, "nfp")])
        os.makedirs(os.path.join(work, "nfp"))
        port = 0
    else:
        collector, port = start_nfcapd(folder)
    subprocess.run(["dd", f"if={trace}", "of=/dev/null", "bs=1M", "status=none"], check=True)
    argv = cmd.replace("TRACE", trace).replace("PORT", str(port)).split()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    proc = subprocess.Popen(argv, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout, stderr = proc.communicate(timeout=1200)
    exited = time.monotonic()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        fail(f"{name} on {tag} exited with {proc.returncode}: {stderr[-500:]}")
    drops = 0
    if collector:
        # Done when nfcapd has read every datagram: its queue empty.
        deadline = exited + 60
        while (q := queued(port)) and q[0] > 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        q = queued(port)
        if q is None or q[0] > 0:
            fail(f"nfcapd did not drain its socket after {name} on {tag}")
        drops = q[1]
    done = time.monotonic()
    if collector:
        collector.send_signal(signal.SIGTERM)
        collector.wait(timeout=60)
    else:
        folder = os.path.join(work, "nfp")
    flows, got_packets, seqfail = nfdump_totals(folder)
    records, evicted = None, 0
    if "--summary-json" in cmd:
        summary = json.loads(stdout)
        records, evicted = summary["records"], summary["evicted_full"]
    lost_packets = packets - got_packets
    complete = lost_packets == 0 and seqfail == 0 and drops == 0 and records in (None, flows)
    if evicted:
        fail(f"{name} on {tag}: {evicted} flows exported early from a full table (give it room)")
    if must_deliver and not complete:
        fail(f"{name} on {tag}: nfdump found {flows} records ({records} exported) and "
             f"{got_packets} of {packets} packets, {seqfail} sequence failures, {drops} socket drops")
    subprocess.run(["rm", "-rf", folder])
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"secs": done - start, "exporter_secs": exited - start, "cpu": cpu,
            "flows": flows, "records": records, "lost_packets": lost_packets,
            "seqfail": seqfail, "drops": drops}


def read_bound(trace):
    """How long one read of the trace out of the page cache takes (cat to /dev/null, as
    read(2) copies it): what every exporter here does at least, so that softflowd's time
    over it is the most any of them can reach against softflowd on this machine."""
    subprocess.run(["dd", f"if={trace}", "of=/dev/null", "bs=1M", "status=none"], check=True)
    start = time.monotonic()
    subprocess.run(["cat", trace], stdout=subprocess.DEVNULL, check=True)
    return time.monotonic() - start


rows = []
for tag, trace, packets in traces:
    results = {e[0]: [] for e in EXPORTERS}
    reads = []
    for r in range(1, rounds + 1):
        reads.append(read_bound(trace))
        print(f"  {tag} round {r} {'read (cat)':<22} {reads[-1]:7.3f} s", flush=True)
        for e in EXPORTERS:
            x = run(e, trace, packets, r, tag)
            results[e[0]].append(x)
            print(f"  {tag} round {r} {e[0]:<22} {x['secs']:7.3f} s to the collector "
                  f"({x['exporter_secs']:.3f} s exporter, {x['cpu']:.2f} s CPU), {x['flows']} records, "
                  f"{x['lost_packets']} packets missing, {x['seqfail']} sequence failures, "
                  f"{x['drops']} socket drops", flush=True)
    base = results["softflowd"]
    read_s = statistics.median(reads)
    rows.append({
        "trace": tag, "packets": packets, "exporter": "read bound (cat)", "median_s": read_s,
        "mpps": packets / read_s / 1e6,
        "vs_softflowd": statistics.median(x["secs"] for x in base) / read_s,
        "vs_softflowd_per_round": statistics.median(b["secs"] / t for b, t in zip(base, reads)),
        "exporter_s": read_s, "cpu_s": float("nan"), "records_at_collector": 0,
        "packets_missing": 0, "sequence_failures": 0, "socket_drops": 0,
    })
    for e in EXPORTERS:
        runs = results[e[0]]
        secs = statistics.median(x["secs"] for x in runs)
        per_round = statistics.median(b["secs"] / x["secs"] for b, x in zip(base, runs))
        worst = max(runs, key=lambda x: (x["lost_packets"], x["seqfail"], x["drops"]))
        rows.append({
            "trace": tag, "packets": packets, "exporter": e[0], "median_s": secs,
            "mpps": packets / secs / 1e6,
            "vs_softflowd": statistics.median(x["secs"] for x in base) / secs,
            "vs_softflowd_per_round": per_round,
            "exporter_s": statistics.median(x["exporter_secs"] for x in runs),
            "cpu_s": statistics.median(x["cpu"] for x in runs),
            "records_at_collector": worst["flows"], "packets_missing": worst["lost_packets"],
            "sequence_failures": worst["seqfail"], "socket_drops": worst["drops"],
        })

print()
head = (f"{'trace':<16}{'exporter':<23}{'median s':>9}{'Mpps':>7}{'vs softflowd':>13}"
        f"{'per round':>10}{'CPU s':>7}{'records':>9}{'pkts missing':>13}{'seq fail':>9}{'drops':>7}")
print(head)
for x in rows:
    print(f"{x['trace']:<16}{x['exporter']:<23}{x['median_s']:>9.3f}{x['mpps']:>7.2f}"
          f"{x['vs_softflowd']:>12.1f}x{x['vs_softflowd_per_round']:>9.1f}x{x['cpu_s']:>7.2f}"
          f"{x['records_at_collector']:>9}{x['packets_missing']:>13}{x['sequence_failures']:>9}"
          f"{x['socket_drops']:>7}")
print("(records, packets missing, sequence failures and drops: the worst round's; the read"
      " bound is one cat of the trace out of the page cache, which every exporter does at least)")

if out != "-":
    keys = list(rows[0].keys())
    with open(out, "w") as f:
        f.write(",".join(keys) + "\n")
        for x in rows:
            f.write(",".join(f"{x[k]:.4f}" if isinstance(x[k], float) else str(x[k]) for k in keys) + "\n")
    # One panel per trace: packets per second to the collector, the ratio to softflowd,
    # and a mark where records were missing.
    bar, width, names = 20, 720, ["read bound (cat)"] + [e[0] for e in EXPORTERS]
    height = 40 + len(traces) * (len(names) * bar + 40)
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}"'
           ' font-family="sans-serif" font-size="12">',
           '<text x="10" y="18">Flow export to the collector (nfdump counts every record):'
           ' Mpps until nfcapd has read it all, median</text>']
    y = 30
    for tag, _, packets in traces:
        panel = [x for x in rows if x["trace"] == tag]
        top = max(x["mpps"] for x in panel)
        svg.append(f'<text x="10" y="{y + 14}" font-weight="bold">{tag} ({packets:,} packets)</text>')
        y += 22
        for x in panel:
            w = (width - 380) * x["mpps"] / top
            lost = x["packets_missing"] or x["sequence_failures"] or x["socket_drops"]
            label = f"{x['mpps']:.2f} ({x['vs_softflowd']:.1f}x softflowd)" + (" records lost" if lost else "")
            svg.append(f'<text x="10" y="{y + 14}">{x["exporter"]}</text>')
            colour = "#c05050" if lost else "#a0a0a0" if x["exporter"].startswith("read") else "#4878a8"
            svg.append(f'<rect x="180" y="{y + 2}" width="{w:.1f}" height="{bar - 6}"'
                       f' fill="{colour}"/>')
            svg.append(f'<text x="{185 + w:.1f}" y="{y + 14}">{label}</text>')
            y += bar
        y += 18
    svg.append("</svg>")
    with open(out.rsplit(".", 1)[0] + ".svg", "w") as f:
        f.write("\n".join(svg) + "\n")
    print(f"wrote {out} and {out.rsplit('.', 1)[0]}.svg")
