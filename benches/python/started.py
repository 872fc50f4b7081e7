"""The floor of a call to a function started ahead, without a container:
starts the native command (argv[3:]), waits until it is blocked reading its
stdin (its imports done, as a warm container's function is when a call
comes), then times writing the input, closing stdin, reading stdout to its
end and reaping the process: what a started call asks of the function, and
nothing of xfn's. Prints the median and p99 in ms of CALLS calls, each
answer checked against the file EXPECT.

Usage: started.py INPUT EXPECT CALLS COMMAND..."""
import subprocess
import sys
import time

INPUT = open(sys.argv[1], "rb").read()
EXPECT = open(sys.argv[2], "rb").read()
CALLS = int(sys.argv[3])
COMMAND = sys.argv[4:]


def blocked_reading_stdin(pid):
    """True once the process sleeps in read(2) on fd 0: the interpreter and
    its imports are done and it waits for its input."""
    try:
        with open(f"/proc/{pid}/syscall") as f:
            fields = f.read().split()
    except OSError:
        return False
    # "0 0x0 ..." is read(2) (x86_64 syscall 0) on fd 0.
    return len(fields) > 1 and fields[0] == "0" and int(fields[1], 16) == 0


durations = []
for call in range(CALLS):
    process = subprocess.Popen(COMMAND, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    deadline = time.monotonic() + 10
    while not blocked_reading_stdin(process.pid):
        if time.monotonic() > deadline or process.poll() is not None:
            sys.exit(f"call {call}: the function never blocked reading its input")
        time.sleep(0.002)
    # Paced as the xfn rows are: the function has been waiting a while.
    time.sleep(0.1)
    began = time.perf_counter()
    process.stdin.write(INPUT)
    process.stdin.close()
    output = process.stdout.read()
    code = process.wait()
    durations.append((time.perf_counter() - began) * 1000)
    if code != 0:
        sys.exit(f"call {call}: exited {code}")
    if output != EXPECT:
        sys.exit(f"call {call}: an answer other than the native run's")


def percentile(ordered, p):
    """The sample at rank p, as benches/server_load.rs picks it for the xfn
    rows beside this one (the nearest rank, halves rounded up)."""
    return ordered[min(len(ordered) - 1, int((len(ordered) - 1) * p + 0.5))]


durations.sort()
print(f"paced_p50_ms={percentile(durations, 0.50):.3f}")
print(f"paced_p99_ms={percentile(durations, 0.99):.3f}")
