"""A program that used the blocking client from many threads, closed it
and ended always exits (issue 38: 4 runs in 9 hung at interpreter
shutdown, a finaliser taking a lock that a frozen daemon thread held).

Each run is a new interpreter: 16 threads acquire and release in a loop,
the main thread closes the client while they still run (one run in
three leaves it unclosed, for its finaliser), and the script ends. (Each run uses keys of its own: grants its workers held when the
client closed stay held until their leases run out.) Every one of 30 runs must exit 0 within its timeout."""

import os
import subprocess
import sys
import textwrap

from conftest import DEADLINE, INSTALLED, SOURCE

SCRIPT = textwrap.dedent(
    """
    import sys, threading, time
    import baton_locks

    client = baton_locks.Client(sys.argv[1])
    done = {"n": 0}
    go = threading.Event()

    def work(i):
        go.wait()
        while True:
            try:
                grant = client.acquire("exit-%s-%d" % (sys.argv[2], i % 4), lease=5, wait=5)
                client.release(grant)
                done["n"] += 1
            except baton_locks.Error:
                pass  # closed: the loop goes on calling, as careless code does

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(16)]
    for t in threads:
        t.start()
    go.set()
    end = time.monotonic() + 5
    while done["n"] < 200 and time.monotonic() < end:
        time.sleep(0.005)
    if sys.argv[3] == "close":
        client.close()
    # No join of the workers (they go on calling the closed client): the
    # script just ends, as a careless CLI tool does.
    print("pairs", done["n"])
    """
)

RUNS = 30


def test_a_closed_client_never_hangs_the_interpreter_at_exit(node, tmp_path):
    script = tmp_path / "many_threads.py"
    script.write_text(SCRIPT)
    env = dict(os.environ)
    if not INSTALLED:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SOURCE), env.get("PYTHONPATH")]))
    hung = []
    for run in range(RUNS):
        proc = subprocess.Popen(
            [sys.executable, str(script), node.addr, str(run), "close" if run % 3 else "no-close"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            out, err = proc.communicate(timeout=DEADLINE * 2)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            hung.append(run)
            continue
        assert proc.returncode == 0, (run, err)
        assert out.startswith("pairs "), (run, out, err)
        assert int(out.split()[1]) > 0, (run, out)
    assert not hung, "runs %r did not exit" % hung
