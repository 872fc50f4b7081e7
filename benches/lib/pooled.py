"""Times the commands of WORK/commands (one `NAME<TAB>COMMAND` per line) in
PASSES hyperfine passes of RUNS/PASSES runs each, in alternating order, and
pools them: hyperfine times one command after the other, so on a shared
machine a change of load would otherwise fall on whichever command ran then.
Prints each command's median and writes them to WORK/medians.json (ms by
name) for the calling bench to print its ratios.

    python3 benches/lib/pooled.py WORK RUNS PASSES [WARMUP]
"""
import json
import os
import statistics
import subprocess
import sys

work, runs, passes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
warmup = sys.argv[4] if len(sys.argv) > 4 else "2"
commands = [line.rstrip("\n").split("\t") for line in open(f"{work}/commands")]
loadavg = lambda: " ".join(open("/proc/loadavg").read().split()[:3])
load_before, times = loadavg(), {name: [] for name, _ in commands}
for n in range(passes):
    order = commands if n % 2 == 0 else commands[::-1]
    args = [a for name, cmd in order for a in ("--command-name", name, cmd)]
    out = f"{work}/hyperfine-{n}.json"
    with open(f"{work}/hyperfine.log", "a") as log:
        timed = subprocess.run(["hyperfine", "--warmup", warmup, "--runs", str(max(2, runs // passes)),
                                "--export-json", out, "-N", *args], stdout=log, stderr=log, cwd=work)
    if timed.returncode != 0:
        sys.exit(f"hyperfine failed: {open(f'{work}/hyperfine.log').read()[-3000:]}")
    for result in json.load(open(out))["results"]:
        times[result["command"]].extend(result["times"])
medians = {name: statistics.median(t) * 1000 for name, t in times.items()}
print(f"CPUs: {os.cpu_count()}; load before/after timing: {load_before} / {loadavg()}")
width = max(len(name) for name in medians) + 10
for name, ms in medians.items():
    print(f"{name + ' (median)':{width}}: {ms:9.1f} ms   ({len(times[name])} runs)")
json.dump(medians, open(f"{work}/medians.json", "w"))
