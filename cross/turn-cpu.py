#!/usr/bin/env python3
"""CLI turn CPU (user+sys, children included, from wait4) of several bramble
binaries, interleaved, against benches/compare/fake_llm.py.
usage: cross/turn-cpu.py RUNS BIN...  -> median / p25 / p75 CPU ms and wall ms per binary"""
import os, sys, subprocess, tempfile, time, statistics, socket
def run_once(argv, env):
    t0 = time.perf_counter()
    pid = os.posix_spawnp(argv[0], argv, env, file_actions=[
        (os.POSIX_SPAWN_OPEN, 1, "/dev/null", os.O_WRONLY, 0),
        (os.POSIX_SPAWN_OPEN, 2, "/dev/null", os.O_WRONLY, 0)])
    _, status, ru = os.wait4(pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{argv} failed with {status}")
    return wall * 1e3, (ru.ru_utime + ru.ru_stime) * 1e3, ru.ru_maxrss / 1024

def bramble_config(path, tmp, base, profile=""):
    with open(path, "w") as f:
        f.write(f'[agent]\nmodel = "m"\nworkspace = "{tmp}/bws"\n{profile}\n[provider]\nbase_url = "{base}"\napi_key = "k"\n'
                f'max_retries = 0\n[heartbeat]\nenabled = false\n[daemon]\nstate_dir = "{tmp}/bstate"\nlog_level = "warn"\n')

n = int(sys.argv[1]); bins = sys.argv[2:]
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
fake = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'benches', 'compare', 'fake_llm.py'), str(port)])
time.sleep(0.7)
tmp = tempfile.mkdtemp(prefix='turn-')
conf = os.path.join(tmp, 'b.toml'); bramble_config(conf, tmp, f'http://127.0.0.1:{port}/v1')
env = dict(os.environ, HOME=tmp, RUST_LOG='warn')
subprocess.run([bins[0], '--config', conf, 'init'], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
res = {b: [] for b in bins}
try:
    for b in bins: run_once([b, '--config', conf, 'agent', '-m', 'run true', '-s', 'warm'], env)
    for i in range(n):
        for b in bins:
            res[b].append(run_once([b, '--config', conf, 'agent', '-m', 'run true', '-s', f's{i}'], env))
finally:
    fake.terminate()
for b in bins:
    cpu = sorted(r[1] for r in res[b]); wall = sorted(r[0] for r in res[b])
    q = lambda v, f: v[int(f * (len(v) - 1))]
    print(f'{b}: cpu p50 {statistics.median(cpu):.2f} ms (p25 {q(cpu,.25):.2f}, p75 {q(cpu,.75):.2f}); wall p50 {statistics.median(wall):.2f} ms; rss p50 {statistics.median(r[2] for r in res[b]):.1f} MB')
