"""The stores (weight broadcast group, torchrun's rendezvous): in a local run, files in the 0700 run
directory that no other user can open, and no store on any port; the TCP stores that remain (Slurm)
and gloo listen on the configured host only. Before: both stores listened on every interface even
when given 127.0.0.1, then on loopback, where any local process read and wrote their keys."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from areal_cli.config.schema import RootConfig
from areal_cli.launcher.plan import child_env, make_plan
from areal_cli.transport.channels import free_ports
from areal_cli.transport.weights import WeightReceiver, WeightSender, param_specs

ROOT = Path(__file__).resolve().parents[2]


def listening(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket ``pid`` listens on, from /proc/<pid>/net/tcp{,6}."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    out = []
    for table, v6 in (("tcp", False), ("tcp6", True)):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            f = line.split()
            if f[3] != "0A" or f[9] not in inodes:  # 0A = LISTEN
                continue
            host, port = f[1].split(":")
            raw = bytes.fromhex(host)
            if v6:
                words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
                addr = str(__import__("ipaddress").IPv6Address(words))
            else:
                addr = ".".join(str(b) for b in raw[::-1])
            out.append((addr, int(port, 16)))
    return out


def test_weight_group_listens_on_the_configured_host_only():
    model = torch.nn.Linear(4, 4)
    port = free_ports("127.0.0.1", 1)[0]
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("rx", WeightReceiver(
        torch.nn.Linear(4, 4), "127.0.0.1", port, 1, 2, "gloo", torch.float32, 1 << 20,
        timeout_s=30)))
    t.start()
    tx = WeightSender(param_specs(model), "127.0.0.1", port, 2, "gloo", torch.device("cpu"),
                      torch.float32,
                      1 << 20, timeout_s=30)
    t.join()
    socks = listening(os.getpid())
    assert tx.store.port == port and port in {p for _, p in socks}  # the store is among them
    assert {a for a, _ in socks} == {"127.0.0.1"}, socks  # store and gloo: loopback only


PROBE = """
import datetime, json, os, sys
import torch.distributed as dist
from areal_cli.trainer.main import init_ranks
init_ranks("gloo", datetime.timedelta(seconds=60))
dist.barrier()
if int(os.environ["RANK"]) == 0:
    sys.path.insert(0, {tests!r})
    from test_stores import listening
    json.dump({{"agent": listening(os.getppid()), "rank0": listening(os.getpid()),
               "port": int(os.environ["MASTER_PORT"]),
               "store": os.environ.get("AREAL_RANKS_STORE", "")}},
              open({out!r}, "w"))
dist.barrier()
dist.destroy_process_group()
from areal_cli.runtime import exit_now
exit_now(0)
"""


def test_torchrun_rendezvous_listens_on_no_port(tmp_path):
    """The launcher's own trainer command, with a probe in place of the trainer: the ranks meet in a
    FileStore inside the (0700) run directory; the agent hosts no store; gloo listens on loopback.
    Before: the agent's TCPStore on 127.0.0.1 let any local process read and write its keys."""
    cfg = RootConfig(run_dir=str(tmp_path / "run"))
    cfg.trainer.ranks = 2
    proc_ = make_plan(cfg, gpus=[]).procs[-1]
    cmd = proc_.argv[:proc_.argv.index("areal_cli.trainer.main") - 1]
    (tmp_path / "run" / "stores").mkdir(parents=True, mode=0o700)
    out = tmp_path / "listening.json"
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE.format(tests=str(Path(__file__).parent), out=str(out)))
    env = {**child_env(proc_.env), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([*cmd, str(probe)], capture_output=True, text=True, timeout=180, env=env,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(out.read_text())
    assert got["store"].startswith(str(tmp_path / "run" / "stores"))
    assert got["agent"] == [], got["agent"]  # no rendezvous store on any port
    assert got["port"] not in {p for _, p in got["rank0"]}
    assert {a for a, _ in got["rank0"]} == {"127.0.0.1"}, got["rank0"]  # gloo: loopback only
    assert sys.executable == cmd[0]


def test_slurm_rendezvous_stores_listen_on_no_wildcard_address(tmp_path):
    """The Slurm script's torchrun (c10d rendezvous, one agent per node), on one node: the
    rendezvous store on the endpoint's host, the ranks' shared store on this node's address."""
    port = free_ports("127.0.0.1", 1)[0]
    out, probe = tmp_path / "listening.json", tmp_path / "probe.py"
    probe.write_text(PROBE.format(tests=str(Path(__file__).parent), out=str(out)))
    cmd = [sys.executable, "-m", "areal_cli.launcher.torchrun", "--nnodes=1", "--nproc-per-node=2",
           "--max-restarts=0", "--rdzv-backend=areal-c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
           "--rdzv-id=t",
           str(probe)]
    env = {**child_env({}), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    agent = json.loads(out.read_text())["agent"]
    assert ["127.0.0.1", port] in agent and len(agent) == 2  # rendezvous store + the ranks' store
    assert not {a for a, _ in agent} & {"0.0.0.0", "::"}, agent


def _store_client_reads(host: str, port: int) -> bool:
    """Whether a TCPStore client with no secret reaches a store at host:port and reads from it."""
    from datetime import timedelta

    try:
        client = torch.distributed.TCPStore(host, port, is_master=False,
                                            timeout=timedelta(seconds=3))
        client.num_keys()
        return True
    except (RuntimeError, ValueError):  # DistNetworkError / DistStoreError: nothing listens there
        return False


@pytest.mark.slow  # a whole run (30-60 s on 2 cores): `make test-slow`, which CI runs too
def test_a_live_runs_stores_refuse_a_client_without_the_runs_files(tiny_model, tmp_path):
    """A real run with two CPU trainer ranks: no TCP store answers at the weight group's or the
    rendezvous' port, and the file stores sit in stores/ (0700), which another user cannot open.
    Before: a TCPStore client on loopback read and wrote both stores' keys."""
    from conftest import AREAL, TINY_RUN

    run = tmp_path / "run"
    cmd = AREAL + ["train", "--quiet", f"run_dir={run}", f"model={tiny_model}", *TINY_RUN,
                   "trainer.steps=40",
                   "trainer.ranks=2", "eval.at_end=false"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + 300
        while not (run / "metrics.jsonl").exists():  # the weight group formed before the first step
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no step within 300 s"
            time.sleep(0.5)
        ep = json.loads((run / "endpoints.json").read_text())
        trainer = next(p for p in _children(proc.pid)
                       if b"areal_cli.launcher.torchrun" in _cmdline(p))
        rdzv = _cmdline(trainer).split(b"--rdzv-endpoint\0")[1].split(b"\0")[0].decode()
        host, port = rdzv.rsplit(":", 1)
        assert not _store_client_reads(ep["weights_host"], ep["weights_port"])
        assert not _store_client_reads(host, int(port))
        stores = run / "stores"
        assert (stat.S_IMODE(stores.stat().st_mode) == 0o700
                and ep["weights_store"].startswith(str(stores)))
        if os.geteuid() == 0:  # another user cannot open the file stores
            code = ("import os, sys; os.setgid(65534); os.setuid(65534)\n"
                    "try:\n    open(sys.argv[1], 'rb')\nexcept PermissionError:\n    sys.exit(3)\n")
            other = subprocess.run([sys.executable, "-c", code, ep["weights_store"]], timeout=30)
            assert other.returncode == 3
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def _cmdline(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()
