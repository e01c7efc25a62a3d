#!/usr/bin/env python3
"""Where a process's CPU goes, by component: reads `perf script` output of a profile
recorded with DWARF call graphs and prints each component's share of the samples, and
each kind of leaf (user code, syscalls, context switches, malloc/free, memcpy).

A sample belongs to the leaf-most frame of a known component; kernel, libc, std, bytes,
mio and tokio's socket registration frames are passed over, so a write(2) counts for the
h2 or redis code that flushed it. With `--per-call US`, shares are also shown as
microseconds of a call that cost US in all.

    perf script -i perf.data --comms bench-servers -F comm,tid,period,ip,sym,dso \\
        | scripts/perf-components.py --per-call 44.1
"""
import argparse
import collections
import re
import sys

COMPONENTS = [
    ("uuid / reservation id", r"uuid::|tag_reservation_id"),
    ("metrics layer (per-RPC)", r"inventory_net::metrics|prometheus_client"),
    ("agent metrics", r"inventory_agent::metrics"),
    ("tracing spans", r"tracing::|tracing_core|tracing_subscriber"),
    ("Redis client (redis crate: encode, parse, connection task)", r"(?<![a-z_:])redis::|combine::"),
    ("store: RedisPoolStore (group commit, reply)", r"inventory_agent::store::redis"),
    ("store: memory", r"inventory_agent::store::memory|inventory_core::pool"),
    ("selling path (agent)",
     r"inventory_agent::selling|inventory_agent::service|inventory_agent::items|inventory_core::channel"
     r"|inventory_agent::security|governor"),
    ("gRPC codec (tonic, prost)", r"tonic::codec|prost::|inventory_proto"),
    ("tonic server / tower layers", r"tonic::|tower::|inventory_net::edge|tower_http"),
    ("HTTP/2 (h2, hyper)", r"h2::|hyper::|hyper_util::"),
    ("tokio scheduler (park, wake, task hand-off)", r"tokio::runtime::(?!io::registration|io::scheduled_io)"),
    ("tokio sync (channels, notify, semaphore)", r"tokio::sync"),
]
KINDS = ["user code", "kernel: syscalls (socket I/O, futex, epoll)", "kernel: context switch", "malloc/free", "memcpy"]


def frames(lines):
    out = []
    for line in lines:
        m = re.match(r"\s*[0-9a-f]+ (.*) \((.*)\)$", line.rstrip("\n"))
        if m:
            out.append((m.group(1), m.group(2)))
    return out


def component(fr):
    for sym, dso in fr:
        if "kernel" in dso or "libc" in dso or "vdso" in dso:
            continue
        for name, pattern in COMPONENTS:
            if re.search(pattern, sym):
                return name
    return "other"


def leaf_kind(fr):
    sym, dso = fr[0]
    if "kernel" in dso:
        if any("finish_task_switch" in s for s, _ in fr[:3]):
            return KINDS[2]
        return KINDS[1]
    if re.search(r"malloc|free|realloc|unlink_chunk|_int_", sym):
        return KINDS[3]
    if re.search(r"memcpy|memmove|memset", sym):
        return KINDS[4]
    return KINDS[0]


def samples(stream):
    lines = []
    for line in stream:
        if line and not line[0].isspace():
            if lines:
                yield frames(lines)
            lines = []
        elif line.strip():
            lines.append(line)
    if lines:
        yield frames(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-call", type=float, help="CPU µs per call, to show shares as µs")
    args = ap.parse_args()
    comp, kind, total = collections.Counter(), collections.Counter(), 0
    for fr in samples(sys.stdin):
        if fr:
            total += 1
            comp[component(fr)] += 1
            kind[leaf_kind(fr)] += 1
    print(f"samples: {total}")
    for title, counts in (("component", comp), ("kind of leaf", kind)):
        print(f"\n{title:60} {'share':>6} {'µs' if args.per_call else '':>6}")
        for name, n in counts.most_common():
            us = f"{args.per_call * n / total:6.1f}" if args.per_call else ""
            print(f"{name:60} {100 * n / total:5.1f}% {us}")


if __name__ == "__main__":
    main()
