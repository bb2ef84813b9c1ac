#!/usr/bin/env bash
# Reads every capture of a corpus (a folder of pcap and pcapng files, e.g. the tcpdump
# project's tests/, many of them deliberately broken) as a new user would: `stateplane
# flows`, and `stateplane run` with each program that runs on its defaults (PROGRAMS, a
# space-separated list, picks some), over each file, each run bounded to 20 s. For each
# file it compares the packets read with the records capinfos (Wireshark) counts, and checks
# that flows' summary adds up (read = packets + not_ip + malformed + oversize) and that
# every program read as many. Writes OUT/capture-corpus.csv (one row a file), OUT/summary.csv and
# OUT/summary.svg (files by link type and outcome), prints the summary, and exits non-zero
# if any run panicked, timed out, or read a count that differs or does not add up.
#   scripts/capture-corpus.sh CORPUS_DIR [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
corpus=${1:?usage: scripts/capture-corpus.sh CORPUS_DIR [OUT_DIR]}
out=${2:-out/capture-corpus}
[ -d "$corpus" ] || { echo "error: $corpus is not a folder of captures" >&2; exit 1; }
bash scripts/setup.sh capinfos:tshark python3 >/dev/null
cargo build --release --quiet
mkdir -p "$out"
programs=${PROGRAMS:-forward l2 l2learn conntrack firewall counter hh superspreader udpflood synflood flowlet router acl pipeline}
python3 - "$corpus" "$out" "$PWD/target/release/stateplane" "$programs" <<'EOF'
import csv, glob, json, os, struct, subprocess, sys, tempfile

corpus, out, stateplane, programs = sys.argv[1:5]
programs = programs.split()
HOST = {0: "BSD loopback", 108: "BSD loopback", 101: "raw IP", 228: "raw IP",
        229: "raw IP", 113: "Linux cooked", 276: "Linux cooked"}

def link_type(path):
    """The link type in a pcap header, or a pcapng file's first interface's."""
    b = open(path, "rb").read(1 << 20)
    if b[:4] in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") and len(b) >= 24:
        return struct.unpack("<I", b[20:24])[0] & 0xffff
    if b[:4] in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d") and len(b) >= 24:
        return struct.unpack(">I", b[20:24])[0] & 0xffff
    if b[:4] == b"\x0a\x0d\x0d\x0a" and len(b) >= 12:
        e = "<" if b[8:12] == b"\x4d\x3c\x2b\x1a" else ">"
        at = struct.unpack(e + "I", b[4:8])[0]
        while at + 12 <= len(b):
            kind, length = struct.unpack(e + "II", b[at:at + 8])
            if kind == 1:
                return struct.unpack(e + "H", b[at + 8:at + 10])[0]
            if length < 12:
                break
            at += length
    return None

def group(linktype):
    if linktype == 1:
        return "Ethernet"
    return HOST.get(linktype, "other link types")

def records(path):
    """capinfos' packet count, or None where it gives none."""
    r = subprocess.run(["capinfos", "-M", "-c", path], capture_output=True, text=True)
    for line in r.stdout.splitlines():
        if line.startswith("Number of packets:"):
            return int(line.split(":")[1])
    return None

def run(args):
    try:
        r = subprocess.run(args, capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return "timeout", None, ""
    err = r.stderr.strip().splitlines()
    if r.returncode == 101 or "panicked" in r.stderr:
        return "panic", None, r.stderr[-300:]
    try:
        summary = json.loads(r.stdout) if r.stdout.strip() else None
    except json.JSONDecodeError:
        summary = None
    status = "read" if r.returncode == 0 else "refused"
    return status, summary, err[-1] if err else ""

rows = []
files = sorted(glob.glob(os.path.join(corpus, "*.pcap")) + glob.glob(os.path.join(corpus, "*.pcapng")))
scratch = tempfile.mkdtemp()
for i, path in enumerate(files):
    if i % 50 == 0:
        print(f"  {i}/{len(files)} files", file=sys.stderr, flush=True)
    lt = link_type(path)
    want = records(path)
    flows, summary, flows_msg = run([stateplane, "flows", "-i", path, "--summary-json", "--csv", "/dev/null"])
    # The worst outcome of the programs' runs, the packets each read, and a message.
    fwd, rx, run_msg = "read", set(), ""
    for program in programs:
        status, run_summary, msg = run([stateplane, "run", program, "--json", "-i", path,
                                        "-o", os.path.join(scratch, "out.pcap")])
        if status != "read" and fwd in ("read", "refused"):
            fwd, run_msg = status, f"{program}: {msg}"
        if run_summary is not None and "counters" in run_summary:
            rx.add(run_summary["counters"]["rx_packets"])
    row = {"file": os.path.basename(path), "link_type": lt, "group": group(lt),
           "capinfos_packets": want, "flows": flows, "run": fwd,
           "read": None, "packets": None, "not_ip": None, "malformed": None, "oversize": None,
           "run_rx_packets": " ".join(map(str, sorted(rx))), "adds_up": None,
           "equals_capinfos": None,
           "message": flows_msg if flows != "read" else run_msg if fwd != "read" else ""}
    if summary is not None and "read" in summary:
        for k in ("read", "packets", "not_ip", "malformed", "oversize"):
            row[k] = summary[k]
        row["adds_up"] = summary["read"] == sum(summary[k] for k in ("packets", "not_ip", "malformed", "oversize"))
        row["equals_capinfos"] = want is not None and summary["read"] == want
    rows.append(row)

with open(os.path.join(out, "capture-corpus.csv"), "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
    w.writeheader()
    w.writerows(rows)

def outcome(r):
    if "panic" in (r["flows"], r["run"]) or "timeout" in (r["flows"], r["run"]):
        return "panic or timeout"
    if r["flows"] != "read" or r["run"] != "read":
        if "is not one Stateplane reads" in r["message"]:
            return "link type refused"
        if r["read"] is not None and r["adds_up"] and r["run_rx_packets"] == str(r["read"]):
            return "read to an error"
        return "refused"
    if not r["adds_up"] or r["run_rx_packets"] != str(r["read"]):
        return "counts differ"
    return "read (= capinfos)" if r["equals_capinfos"] else "read (!= capinfos)"

summary = {}
for r in rows:
    key = (r["group"], outcome(r))
    summary[key] = summary.get(key, 0) + 1
with open(os.path.join(out, "summary.csv"), "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["outcome", "link types", "files"])
    for (g, o), n in sorted(summary.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        w.writerow([o, g, n])
print(f"{len(files)} captures in {corpus}, through flows and run {' '.join(programs)}: "
      f"{len(files) * (1 + len(programs))} runs")
print(f"{'link types':<18} {'outcome':<20} {'files':>5}")
for (g, o), n in sorted(summary.items()):
    print(f"{g:<18} {o:<20} {n:>5}")
bad = [r for r in rows if outcome(r) in ("panic or timeout", "counts differ")]
for r in bad:
    print(f"  {outcome(r)}: {r['file']}: {r['message']}")
host = [r for r in rows if r["group"] not in ("Ethernet", "other link types")]
equal = [r for r in host if outcome(r) == "read (= capinfos)"]
print(f"host link types: {len(equal)} of {len(host)} files read with capinfos' packet count")
sys.exit(1 if bad else 0)
EOF
status=$?
target/release/stateplane chart --from "$out/summary.csv" --svg "$out/summary.svg" \
  --title "Captures of $(basename "$(cd "$corpus" && pwd)")" --unit files >/dev/null
echo "wrote $out/capture-corpus.csv, $out/summary.csv, $out/summary.svg"
exit $status
