#!/usr/bin/env python3
"""The conformance suite's runner: every scenario against every official client.

Usage (from anywhere; paths are found from this file):

    python3 conformance/run.py                      # build every driver, play everything
    python3 conformance/run.py --client go --scenario release-retry-after-drop
    python3 conformance/run.py --list               # the scenarios and what each covers

It reads ``conformance/drivers.json`` (under ``--root``, the repository
whose drivers to use: this one by default), runs each client's ``build``
commands once from that root, then plays each scenario against each
client (``conformance/scenarios/*.json``): a fresh driver process, fresh
``batond`` nodes (``--batond``, else ``$BATON_BATOND``, else
``target/release/batond``) and scripted nodes for each cell. It prints a
table, scenario by client, then the failures with the driver's stderr and
the nodes' logs, and a closing ``N passed, N failed`` line. It exits 1 when
any cell is not ``pass`` (``n/a``: a flavour without a capability the
scenario needs, such as abandoning a call, is not a failure) and 2 on a
usage or build error.

Why Python: the suite needs processes, sockets with timing, a small server
that misbehaves on cue and JSON, and Python's standard library has all
four; the repository already builds and tests a Python package, so CI has
it, and a scenario or a check can be changed without rebuilding the crate.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import fnmatch
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from harness import pki, scenario  # noqa: E402

AUTH_SECRET = "conformance-secret-0123456789"
BUILD_TIMEOUT_S = 1200


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--root", default=os.path.dirname(HERE),
                   help="the repository whose conformance/drivers.json and drivers to use")
    p.add_argument("--client", action="append", default=[],
                   help="a client of drivers.json (repeat, or comma-separated); default: all")
    p.add_argument("--scenario", action="append", default=[],
                   help="a scenario name or glob (repeat); default: all")
    p.add_argument("--batond", default=None, help="the batond to run (default $BATON_BATOND, "
                   "else <this repository>/target/release/batond)")
    p.add_argument("--jobs", type=int, default=2, help="cells played at once (default 2)")
    p.add_argument("--no-build", action="store_true", help="skip the drivers' build commands")
    p.add_argument("--list", action="store_true", help="list the scenarios and what they cover")
    p.add_argument("--keep", action="store_true", help="keep the run's directory (logs, certificates)")
    return p.parse_args()


def load_scenarios(patterns: list[str]) -> list[scenario.Scenario]:
    paths = sorted(glob.glob(os.path.join(HERE, "scenarios", "*.json")))
    out = []
    for path in paths:
        sc = scenario.load(path)
        if not patterns or any(fnmatch.fnmatch(sc.name, p) for p in patterns):
            out.append(sc)
    return out


def build(root: str, drivers: dict[str, dict], clients: list[str]) -> None:
    done: set[str] = set()
    for name in clients:
        for cmd in drivers[name].get("build", []):
            key = json.dumps(cmd)
            if key in done:
                continue
            done.add(key)
            print(f"build {name}: {' '.join(cmd)}", flush=True)
            started = time.monotonic()
            result = subprocess.run(cmd, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    timeout=BUILD_TIMEOUT_S)
            if result.returncode != 0:
                sys.stdout.write(result.stdout.decode(errors="replace")[-6000:])
                raise SystemExit(f"building the {name} driver failed (exit {result.returncode})")
            print(f"  done in {time.monotonic() - started:.0f} s", flush=True)


def main() -> int:
    args = parse_args()
    scenarios = load_scenarios(args.scenario)
    if args.list:
        for sc in scenarios:
            needs = f" (needs {', '.join(sc.needs)})" if sc.needs else ""
            print(f"{sc.name}{needs}")
            for c in sc.covers:
                print(f"    {c}")
        return 0
    if not scenarios:
        print("no scenario matches", file=sys.stderr)
        return 2
    root = os.path.abspath(args.root)
    with open(os.path.join(root, "conformance", "drivers.json")) as f:
        drivers: dict[str, dict] = json.load(f)
    clients = [c for arg in args.client for c in arg.split(",") if c] or list(drivers)
    unknown = [c for c in clients if c not in drivers]
    if unknown:
        print(f"not in drivers.json: {', '.join(unknown)}", file=sys.stderr)
        return 2
    batond = os.path.abspath(args.batond or os.environ.get("BATON_BATOND")
                             or os.path.join(os.path.dirname(HERE), "target", "release", "batond"))
    if not os.access(batond, os.X_OK):
        print(f"no batond at {batond}: build it (cargo build --release) or pass --batond",
              file=sys.stderr)
        return 2
    if not args.no_build:
        build(root, drivers, clients)

    run_dir = tempfile.mkdtemp(prefix="baton-conformance-")
    secrets = pki.make(os.path.join(run_dir, "pki"))
    secrets["auth"] = AUTH_SECRET
    secrets["bad_auth"] = "conformance-wrong-secret-0000"

    cells = [(sc, c) for sc in scenarios for c in clients]
    results: dict[tuple[str, str], tuple[str, str]] = {}
    reports: dict[tuple[str, str], str] = {}

    def play(sc: scenario.Scenario, client: str) -> None:
        workdir = os.path.join(run_dir, f"{sc.name}--{client}")
        os.makedirs(workdir, exist_ok=True)
        argv = list(drivers[client]["run"])
        if argv and os.sep in argv[0] and not os.path.isabs(argv[0]):
            argv[0] = os.path.join(root, argv[0])
        run = scenario.Run(sc, client, argv, root, batond, workdir, secrets)
        started = time.monotonic()
        verdict, detail = run.play()
        results[(sc.name, client)] = (verdict, detail)
        took = time.monotonic() - started
        print(f"{verdict:4} {sc.name} [{client}] {took:.1f} s{': ' + detail if detail else ''}",
              flush=True)
        if verdict == "FAIL":
            reports[(sc.name, client)] = run.report()

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for f in [pool.submit(play, sc, c) for sc, c in cells]:
            f.result()

    width = max(len(sc.name) for sc in scenarios)
    print()
    print(" " * width + "  " + "  ".join(f"{c:>14}" for c in clients))
    for sc in scenarios:
        row = [results[(sc.name, c)][0] for c in clients]
        print(f"{sc.name:<{width}}  " + "  ".join(f"{v:>14}" for v in row))
    for (name, client), text in sorted(reports.items()):
        print(f"\n===== {name} [{client}]: {results[(name, client)][1]}\n{text}")
    passed = sum(1 for v, _ in results.values() if v == "pass")
    failed = sum(1 for v, _ in results.values() if v == "FAIL")
    skipped = sum(1 for v, _ in results.values() if v == "n/a")
    if args.keep or failed:
        print(f"\nthe run's logs: {run_dir}")
    else:
        shutil.rmtree(run_dir, ignore_errors=True)
    print(f"\nconformance: {passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
