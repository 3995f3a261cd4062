"""What a benchmark ran on: the CPU and the instruction sets that pick its kernels, the memory
bandwidth, and how much CPU time the hypervisor took away during the run. Rates mean little without
these (this project's hosts moved 10-37 GB/s and some had bf16 units); `run bench` and the scripts
in benchmarks/ write them into every result. Torch-free; numpy only for the bandwidth probe.
"""

from __future__ import annotations

import os
import platform
import re
import time

# The instruction sets that decide which kernels a CPU runs (bf16 and VNNI units change which runtime
# is fastest for embed and classify; without them float32 is the ceiling)
ISA_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16", "amx_int8")
BANDWIDTH_MIB = 512  # the buffer the bandwidth probe copies: well past any CPU's last-level cache


def cpu_facts(cpuinfo: str | None = None) -> dict:
    """The CPU's model name and which of ISA_FLAGS it has, from /proc/cpuinfo (Linux); empty where
    there is none."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                cpuinfo = f.read()
        except OSError:
            return {}
    name = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.M)
    flags = re.search(r"^flags\s*:\s*(.+)$", cpuinfo, re.M)
    have = set(flags.group(1).split()) if flags else set()
    return {"cpu": name.group(1).strip() if name else None, "isa": [f for f in ISA_FLAGS if f in have]}


def memory_bandwidth_gbs(mib: int = BANDWIDTH_MIB, repeats: int = 5) -> float | None:
    """Host memory bandwidth in GB/s: a ``mib`` MiB numpy copy, bytes read plus bytes written over
    the best of ``repeats`` copies. The same probe docs/performance.md's tables quote: absolute rates move
    with it (10-37 GB/s across this project's hosts), same-run ratios do not."""
    try:
        import numpy as np
    except ImportError:
        return None
    try:
        src = np.ones(mib * 2**20 // 8)
        dst = np.empty_like(src)
    except MemoryError:  # a small machine: no number rather than no benchmark
        return None
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t)
    return round(2 * src.nbytes / best / 1e9, 1)


def cpu_ticks(stat: str | None = None) -> tuple[int, int] | None:
    """(steal, total) CPU ticks since boot, from /proc/stat's first line (Linux; None elsewhere).
    Steal is time the hypervisor gave this VM's CPUs to someone else."""
    if stat is None:
        try:
            with open("/proc/stat", encoding="ascii") as f:
                stat = f.readline()
        except OSError:
            return None
    fields = stat.split()
    if not fields or fields[0] != "cpu" or len(fields) < 9:
        return None
    ticks = [int(x) for x in fields[1:9]]  # user nice system idle iowait irq softirq steal
    return ticks[7], sum(ticks)


def steal_pct(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The share of CPU time stolen by the hypervisor between two ``cpu_ticks`` readings: on a
    shared VM, a run with a few percent stolen is a noisy run, whatever its load average says."""
    if not before or not after or after[1] <= before[1]:
        return None
    return round(100 * (after[0] - before[0]) / (after[1] - before[1]), 1)


def host(bandwidth: bool = False) -> dict:
    """What the numbers were measured on (they mean little without it). ``bandwidth`` adds the
    measured memory bandwidth (about a second and 1 GiB of memory for the probe)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count() or 1
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    facts = {
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "cpus": cpus,
        "load_average_1min": None if load is None else round(load, 2),
        "python": platform.python_version(),
    }
    facts |= cpu_facts()
    if bandwidth:
        facts["memory_bandwidth_gbs"] = memory_bandwidth_gbs()
    return facts
