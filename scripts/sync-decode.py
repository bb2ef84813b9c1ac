#!/usr/bin/env python3
"""Reads Stateplane's sync messages from a capture as an outside reader would: a decoder
written from docs/SYNC.md's *Messages (version 1)* alone, sharing no code with the
switch or the collector. Every UDP datagram of the capture is checked against that
section (header fields, entries of 24 bytes or runs, a MAC checked with b3sum's keyed
BLAKE3 when a key file is given); the copy the switch's updates and refreshes build is
compared with a collector's `--dump`, location by location.

    scripts/sync-decode.py CAPTURE KEY_FILE|- DUMP_CSV|- [--lossy]

`--lossy`: the capture is of a path that lost or repeated messages (a relay's), so a
stream's numbers may skip or come again; without it each must be one more than the last.

Exits 1, naming each kind of problem, if any datagram departs from the document or the
copy differs; crates/cli/tests/sync.rs runs it on a captured run.
"""
import collections
import os
import struct
import subprocess
import sys
import tempfile

KINDS = {1: "updates", 2: "refresh", 3: "heartbeat", 4: "report", 5: "write part",
         6: "write acknowledgement", 7: "layout", 8: "request for lost messages"}
FROM_SWITCH = {1, 2, 3, 6, 7}
NUMBERED = {1, 2, 3, 7}  # a stream's messages: seq one more each
MAX_ENTRIES, MAX_RUN_ENTRIES = 2726, 65535


def udp_payloads(path):
    """The UDP payloads of a pcap capture (Ethernet or Linux cooked on loopback, IPv4)."""
    data = open(path, "rb").read()
    magic = struct.unpack_from("<I", data, 0)[0]
    endian = "<" if magic in (0xA1B2C3D4, 0xA1B23C4D) else ">"
    linktype = struct.unpack_from(endian + "I", data, 20)[0]
    link_len = {1: 14, 113: 16, 276: 20}[linktype]
    at = 24
    while at + 16 <= len(data):
        caplen = struct.unpack_from(endian + "I", data, at + 8)[0]
        frame = data[at + 16:at + 16 + caplen]
        at += 16 + caplen
        ip = frame[link_len:]
        if len(ip) < 20 or ip[0] >> 4 != 4 or ip[9] != 17:
            continue
        udp = ip[(ip[0] & 0x0F) * 4:]
        length = struct.unpack_from(">H", udp, 4)[0]
        yield udp[8:length]


def main():
    capture, key_file, dump = sys.argv[1:4]
    lossy = sys.argv[4:] == ["--lossy"]
    key = bytes.fromhex(open(key_file).read().strip()) if key_file != "-" else None
    problems = collections.Counter()
    kinds = collections.Counter()
    entries_of = collections.Counter()
    last_seq = {}
    copy = {}
    signed = []

    def check(ok, what):
        if not ok:
            problems[what] += 1
        return ok

    def entries(body, count, as_runs):
        out = []
        if not as_runs:
            check(count <= MAX_ENTRIES, "more than 2,726 entries")
            if not check(len(body) == 24 * count, "entries of other than 24 bytes"):
                return out
            for i in range(count):
                state, reserved, index, value, threshold = struct.unpack_from(">HHIQQ", body, 24 * i)
                check(reserved == 0, "an entry's reserved bytes not 0")
                out.append((state, index, value, threshold))
            return out
        check(count <= MAX_RUN_ENTRIES, "more than 65,535 entries as runs")
        at, left = 0, count
        while at < len(body):
            if not check(at + 20 <= len(body), "a run header cut short"):
                break
            state, width, reserved, first, length, threshold = struct.unpack_from(">HBBIIQ", body, at)
            at += 20
            check(width in (0, 1, 2, 4, 8), "a run width not 0, 1, 2, 4 or 8")
            check(reserved == 0, "a run's reserved byte not 0")
            check(1 <= length <= left, "a run longer than the entries left")
            check(first + length - 1 <= 2**32 - 1, "a run past index 2^32 - 1")
            for j in range(min(length, left)):
                value = int.from_bytes(body[at:at + width], "big") if width else 0
                at += width
                out.append((state, first + j, value, threshold))
            left -= length
        check(at == len(body), "bytes past the last run")
        check(left == 0, "runs short of the count")
        return out

    for d in udp_payloads(capture):
        if not check(len(d) >= 40, "a datagram shorter than the header"):
            continue
        (version, kind, flags, reserved, switch, epoch, stream, count, seq, _sent,
         _t_max) = struct.unpack_from(">BBBBIIHHQQQ", d, 0)
        check(version == 1, "a version other than 1")
        check(kind in KINDS, "an unknown kind")
        check(flags & ~0x07 == 0, "flags other than 0x01, 0x02, 0x04")
        check(reserved == 0, "the header's reserved byte not 0")
        kinds[KINDS.get(kind, kind)] += 1
        end = len(d)
        if flags & 0x02:
            check(key is not None, "a MAC where no key is set")
            end -= 32
            signed.append(d)
        else:
            check(key is None, "no MAC where a key is set")
        body = d[40:end]
        if kind in (3, 4):
            check(count == 0 and not body, "a heartbeat or report with entries")
        got = entries(body, count, flags & 0x04)
        entries_of[KINDS.get(kind, kind)] += len(got)
        if kind in NUMBERED:
            check(seq not in (0, 2**64 - 1), "seq 0 or 2^64 - 1")
            s = (switch, stream)
            if not lossy and s in last_seq and last_seq[s][0] == epoch:
                check(seq == last_seq[s][1] + 1, "a stream's seq not one more than the last")
            last_seq[s] = (epoch, seq)
        if kind in (1, 2):
            for state, index, value, _threshold in got:
                copy[(switch, stream, state, index)] = value

    if key is not None and signed:
        # b3sum --keyed reads the key (32 bytes) from standard input and hashes the files
        # named: one call for every signed datagram.
        with tempfile.TemporaryDirectory() as scratch:
            names = []
            for i, d in enumerate(signed):
                name = os.path.join(scratch, str(i))
                open(name, "wb").write(d[:-32])
                names.append(name)
            out = subprocess.run(["b3sum", "--keyed", "--no-names", *names], input=key,
                                 capture_output=True, check=True).stdout.decode().split()
        for d, mac in zip(signed, out):
            check(bytes.fromhex(mac) == d[-32:], "a MAC the key did not make")
        check(len(out) == len(signed), "b3sum did not hash every datagram")

    held = differing = 0
    if dump != "-":
        for line in open(dump).read().splitlines()[1:]:
            switch, stream, state, index, value = (int(f) for f in line.split(",")[:5])
            held += 1
            differing += copy.get((switch, stream, state, index)) != value
        check(held == len(copy), "locations the dump and the capture do not share")
    print("datagrams by kind:", dict(kinds))
    print("entries by kind:", dict(entries_of))
    print(f"MACs checked: {len(signed) if key is not None else 0}")
    if dump != "-":
        print(f"copy from the capture: {len(copy)} locations; the dump: {held}; differing: {differing}")
    print(f"problems: {sum(problems.values())}")
    for what, n in problems.most_common():
        print(f"  {n} x {what}")
    sys.exit(1 if problems or differing else 0)


if __name__ == "__main__":
    main()
