"""Side by side: bramble and nanobot against the same zero-latency fake LLM.

Run by benches/compare.sh, which builds bramble, makes the venv with
nanobot-ai 0.3.5 and passes the paths. Figures:

1. one CLI turn with one `exec` tool call (`true`): wall time, CPU (user +
   system of the process and the children it waited for, from wait4) and
   peak RSS, over N cold runs (each a new process), median and p90;
2. the idle daemon (`bramble run` / `nanobot gateway`, no channels, heartbeat
   off): RSS and anonymous memory 30 s after start (bramble releases its
   start-up pages at 20 s), and wake-ups per minute as the context switches
   of all its threads over the idle window;
3. the first prompt (issue 43): the FIRST request body of the same turn as a
   second fake (fake_llm.py with FAKE_LLM_RECORD) received it, in tokens
   estimated as characters / 4 (no tokenizer: the same estimate for all),
   with its tool count and the bytes of its tool schemas; bramble with the
   default and the lean profile, and nanobot.

Prints Markdown tables with the ratios (nanobot / bramble). COMPARE_ONLY=prompt
measures the first prompt only (seconds instead of minutes).
"""
import json, os, signal, statistics, subprocess, sys, tempfile, time

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

def turns(argv, env, n):
    # Each run a new session, as a first message would be: the same work every time.
    run_once(argv + ["warm"], env)  # warm the page cache
    rows = [run_once(argv + [f"bench{i}"], env) for i in range(n)]
    cols = list(zip(*rows))
    med = [statistics.median(c) for c in cols]
    p90 = [sorted(c)[int(0.9 * (len(c) - 1))] for c in cols]
    return med, p90

def status(pid, key):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(key):
            return int(line.split()[1])
    return 0

def switches(pid):
    total = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            for line in open(f"/proc/{pid}/task/{t}/status"):
                if "ctxt_switches" in line:
                    total += int(line.split()[1])
        except FileNotFoundError:
            pass
    return total

def idle(argv, env, settle, window):
    p = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(settle)
        if p.poll() is not None:
            sys.exit(f"{argv} exited during start-up")
        # The process and every descendant (a Python launcher may fork).
        rss, anon = status(p.pid, "VmRSS:"), status(p.pid, "RssAnon:")
        s0 = switches(p.pid)
        time.sleep(window)
        s1 = switches(p.pid)
        return rss / 1024, anon / 1024, max(s1 - s0, 0) * 60 / window
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()

def free_port():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port

def first_prompt(argv, env, record):
    """The first chat request of one turn: (tokens, tools, schema bytes)."""
    open(record, "w").close()
    run_once(argv, env)
    for line in open(record):
        r = json.loads(line)
        if "messages" in r["body"]:
            tools = r["body"].get("tools") or []
            schema = len(json.dumps(tools, ensure_ascii=False, separators=(",", ":")).encode())
            return r["chars"] // 4, len(tools), schema
    sys.exit(f"{argv}: no chat request recorded")

def prompts(runs, record, port):
    """First-prompt figures, against a recording fake of its own on `port`."""
    fake = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__), "fake_llm.py"), str(port)],
                            env=dict(os.environ, FAKE_LLM_RECORD=record))
    try:
        time.sleep(0.5)
        return [(name, first_prompt(argv, env, record)) for name, argv, env in runs]
    finally:
        fake.terminate()
        fake.wait()

def bramble_config(path, tmp, base, profile=""):
    with open(path, "w") as f:
        f.write(f'[agent]\nmodel = "m"\nworkspace = "{tmp}/bws"\n{profile}\n[provider]\nbase_url = "{base}"\napi_key = "k"\n'
                f'max_retries = 0\n[heartbeat]\nenabled = false\n[daemon]\nstate_dir = "{tmp}/bstate"\nlog_level = "warn"\n')

def main():
    bramble, nanobot, fake_port, n, window = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    base = f"http://127.0.0.1:{fake_port}/v1"
    tmp = tempfile.mkdtemp(prefix="compare-")
    # bramble
    bconf = os.path.join(tmp, "bramble.toml")
    bramble_config(bconf, tmp, base)
    benv = dict(os.environ, HOME=tmp, RUST_LOG="warn")
    subprocess.run([bramble, "--config", bconf, "init"], env=benv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # nanobot
    nhome = os.path.join(tmp, "nhome")
    os.makedirs(os.path.join(nhome, ".nanobot"))
    with open(os.path.join(nhome, ".nanobot", "config.json"), "w") as f:
        json.dump({"agents": {"defaults": {"workspace": f"{nhome}/ws", "model": "m", "provider": "custom", "maxTokens": 512}},
                   "providers": {"custom": {"apiKey": "k", "apiBase": base}},
                   "gateway": {"heartbeat": {"enabled": False}}}, f)
    nenv = dict(os.environ, HOME=nhome)
    # The first prompt, against a recording fake of its own (the timed runs are not slowed by the recording).
    pport = free_port()
    pbase = f"http://127.0.0.1:{pport}/v1"
    pconf, lconf = os.path.join(tmp, "prompt.toml"), os.path.join(tmp, "lean.toml")
    bramble_config(pconf, tmp, pbase)
    bramble_config(lconf, tmp, pbase, 'profile = "lean"')
    pnhome = os.path.join(tmp, "pnhome")
    os.makedirs(os.path.join(pnhome, ".nanobot"))
    with open(os.path.join(nhome, ".nanobot", "config.json")) as f:
        ncfg = json.load(f)
    ncfg["providers"]["custom"]["apiBase"] = pbase
    ncfg["agents"]["defaults"]["workspace"] = f"{pnhome}/ws"
    with open(os.path.join(pnhome, ".nanobot", "config.json"), "w") as f:
        json.dump(ncfg, f)
    record = os.path.join(tmp, "requests.jsonl")
    runs = [("bramble, default profile", [bramble, "--config", pconf, "agent", "-m", "run true", "-s", "p1"], benv),
            ("bramble, lean profile", [bramble, "--config", lconf, "agent", "-m", "run true", "-s", "p2"], benv)]
    if nanobot != "-":
        runs.append(("nanobot 0.3.5", [nanobot, "agent", "-m", "run true", "-s", "p3"], dict(os.environ, HOME=pnhome)))
    figures = prompts(runs, record, pport)
    print("| first request of a CLI turn with one exec call | tokens (characters / 4) | tools | bytes of tool schemas |")
    print("|---|---|---|---|")
    for name, (tokens, tools, schema) in figures:
        print(f"| {name} | {tokens:,} | {tools} | {schema:,} |")
    print()
    if os.environ.get("COMPARE_ONLY") == "prompt" or nanobot == "-":
        return
    b_turn = turns([bramble, "--config", bconf, "agent", "-m", "run true", "-s"], benv, n)
    n_turn = turns([nanobot, "agent", "-m", "run true", "-s"], nenv, n)
    b_idle = idle([bramble, "--config", bconf, "run"], benv, 30, window)
    n_idle = idle([nanobot, "gateway"], nenv, 30, window)
    ratio = lambda a, b: f"{a / b:.0f}×" if b > 0 else "—"
    print(f"| figure ({n} cold runs; idle {window} s) | bramble | nanobot 0.3.5 | nanobot / bramble |")
    print("|---|---|---|---|")
    names = ["CLI turn with one exec call: wall, median (p90)", "CLI turn: CPU (user + system, with children), median (p90)",
             "CLI turn: peak RSS, median (p90)"]
    units = ["ms", "ms", "MB"]
    for i, name in enumerate(names):
        b, nb = (b_turn[0][i], b_turn[1][i]), (n_turn[0][i], n_turn[1][i])
        print(f"| {name} | {b[0]:.1f} ({b[1]:.1f}) {units[i]} | {nb[0]:.1f} ({nb[1]:.1f}) {units[i]} | {ratio(nb[0], b[0])} |")
    print(f"| idle daemon: RSS | {b_idle[0]:.1f} MB | {n_idle[0]:.1f} MB | {ratio(n_idle[0], b_idle[0])} |")
    print(f"| idle daemon: anonymous memory | {b_idle[1]:.1f} MB | {n_idle[1]:.1f} MB | {ratio(n_idle[1], b_idle[1])} |")
    print(f"| idle daemon: wake-ups per minute (all threads' context switches) | {b_idle[2]:.1f} | {n_idle[2]:.1f} | "
          f"{ratio(n_idle[2], b_idle[2]) if b_idle[2] >= 1 else '—'} |")

main()
