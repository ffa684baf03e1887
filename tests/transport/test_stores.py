"""The TCP stores (weight broadcast group, torchrun's rendezvous) and gloo listen on the configured
host only. Before: both stores listened on every interface even when given 127.0.0.1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

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
        torch.nn.Linear(4, 4), "127.0.0.1", port, 1, 2, "gloo", torch.float32, 1 << 20, timeout_s=30)))
    t.start()
    tx = WeightSender(param_specs(model), "127.0.0.1", port, 2, "gloo", torch.device("cpu"), torch.float32,
                      1 << 20, timeout_s=30)
    t.join()
    socks = listening(os.getpid())
    assert tx.store.port == port and port in {p for _, p in socks}  # the store is among them
    assert {a for a, _ in socks} == {"127.0.0.1"}, socks  # store and gloo: loopback only


PROBE = """
import json, os, sys
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
if int(os.environ["RANK"]) == 0:
    sys.path.insert(0, {tests!r})
    from test_stores import listening
    json.dump({{"agent": listening(os.getppid()), "rank0": listening(os.getpid()),
               "port": int(os.environ["MASTER_PORT"])}}, open({out!r}, "w"))
dist.barrier()
dist.destroy_process_group()
"""


def test_torchrun_rendezvous_listens_on_the_configured_host_only(tmp_path):
    """The launcher's own trainer command, with a probe in place of the trainer."""
    cfg = RootConfig(run_dir=str(tmp_path / "run"))
    cfg.trainer.ranks = 2
    argv = make_plan(cfg, gpus=[]).procs[-1]
    cmd = argv.argv[:argv.argv.index("areal_cli.trainer.main") - 1]
    out = tmp_path / "listening.json"
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE.format(tests=str(Path(__file__).parent), out=str(out)))
    env = {**child_env(argv.env), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([*cmd, str(probe)], capture_output=True, text=True, timeout=180, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(out.read_text())
    assert got["port"] in {p for _, p in got["agent"]}  # the rendezvous store, hosted by the agent
    for who in ("agent", "rank0"):
        assert {a for a, _ in got[who]} == {"127.0.0.1"}, (who, got[who])
    assert sys.executable == cmd[0]


def test_slurm_rendezvous_stores_listen_on_no_wildcard_address(tmp_path):
    """The Slurm script's torchrun (c10d rendezvous, one agent per node), on one node: the
    rendezvous store on the endpoint's host, the ranks' shared store on this node's address."""
    port = free_ports("127.0.0.1", 1)[0]
    out, probe = tmp_path / "listening.json", tmp_path / "probe.py"
    probe.write_text(PROBE.format(tests=str(Path(__file__).parent), out=str(out)))
    cmd = [sys.executable, "-m", "areal_cli.launcher.torchrun", "--nnodes=1", "--nproc-per-node=2",
           "--max-restarts=0", "--rdzv-backend=areal-c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=t",
           str(probe)]
    env = {**child_env({}), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    agent = json.loads(out.read_text())["agent"]
    assert ["127.0.0.1", port] in agent and len(agent) == 2  # rendezvous store + the ranks' store
    assert not {a for a, _ in agent} & {"0.0.0.0", "::"}, agent
