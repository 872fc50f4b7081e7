"""What a Python function does every day, run under xfn's seccomp profile
by tests/run_bounds.rs: files in a temporary dir under /tmp, json, threads
and a subprocess of /bin/sh. With LIST_FILES=PATH it also writes the file
of every module it imported to PATH: the test runs it so on the host first
and puts exactly those files (and the interpreter's shared libraries) into
the image, so the image holds what this program needs, whatever the
host's Python version."""
import json, os, subprocess, sys, tempfile, threading

with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "doc.json")
    with open(path, "w") as f:
        json.dump({"items": list(range(5))}, f)
    with open(path) as f:
        doc = json.load(f)
print("json", sum(doc["items"]))
squares = []
lock = threading.Lock()
def work(i):
    with lock:
        squares.append(i * i)
threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
for t in threads: t.start()
for t in threads: t.join()
print("threads", sum(squares))
out = subprocess.run(["/bin/sh", "-c", "echo $((6 * 7))"], capture_output=True, text=True, check=True)
print("subprocess", out.stdout.strip())
listing = os.environ.get("LIST_FILES")
if listing:
    with open(listing, "w") as f:
        for m in list(sys.modules.values()):
            p = getattr(m, "__file__", None)
            if p: f.write(p + "\n")
