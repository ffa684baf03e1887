"""The sbatch script and the node layout of launcher=slurm — no Slurm needed."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from areal_cli.launcher import slurm_job
from areal_cli.launcher.slurm import build
from areal_cli.launcher.slurm_layout import slurm_layout
from areal_cli.runconfig.compose import compose, save_yaml


def _cfg(tmp_path, *overrides):
    return compose(["launcher=slurm", f"run_dir={tmp_path / 'run'}", *overrides])


def test_two_nodes_of_eight_gpus(tmp_path):
    cfg = _cfg(tmp_path, "launcher.nodes=2", "launcher.gpus_per_node=8", "launcher.partition=gpu",
               "launcher.time=01:00:00")
    plan, script, notes = build(cfg, python="/opt/venv/bin/python")
    # the layout: node 0 generates (8 workers, one GPU each), node 1 trains (8 ranks)
    assert (cfg.rollout.workers, cfg.trainer.ranks) == (8, 8) and len(notes) == 2
    must = [
        "#SBATCH --nodes=2", "#SBATCH --gpus-per-node=8", "#SBATCH --partition=gpu",
        "#SBATCH --time=01:00:00", "#SBATCH --exclusive", "#SBATCH --requeue",
        "#SBATCH --signal=B:USR1@120", f"#SBATCH --output={plan.run_dir}/logs/slurm-%j.out",
        # node lists, resolved inside the job from the allocation
        'mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")',
        "HEAD=${NODES[0]}", "GEN_NODES=$(list 0 1)", "TRAIN_NODES=$(list 1 1)",
        # hostnames: ports + hostname of the first training node, endpoints rewritten on node 0
        '--nodelist="${NODES[1]}" --gres=none "$PY" -m areal_cli.launcher.slurm_job ports',
        '"$PY" -m areal_cli.launcher.slurm_job prepare "$RUN_DIR" "$TRAIN_HOST" "$WEIGHTS_PORT" '
        '"$RDZV_PORT"',
        # controller: node 0, no GPU
        '--nodes=1 --ntasks=1 --nodelist="$HEAD" --gres=none',
        "-m areal_cli.controller.main",
        # rollout: 8 tasks on the generation node, one GPU each
        '--nodes=1 --nodelist="$GEN_NODES" --ntasks=8 --ntasks-per-node=8',
        "--gpus-per-task=1", 'slurm_job rollout "$RUN_DIR" 1',
        # trainer: one torchrun per training node with all its GPUs, c10d rendezvous
        '--nodes=1 --nodelist="$TRAIN_NODES" --ntasks=1 --ntasks-per-node=1', "--gpus-per-node=8",
        "--nnodes=1 --nproc-per-node=8", "--rdzv-backend=areal-c10d",
        "-m areal_cli.launcher.torchrun",
        '--rdzv-endpoint="$TRAIN_HOST:$RDZV_PORT"', '--rdzv-id="$SLURM_JOB_ID"',
        # every step overlaps on CPUs; a failed task kills its step; the job fails with it
        "srun --overlap --kill-on-bad-exit=1", 'echo "$SLURM_JOB_ID" > "$RUN_DIR/slurm_job_id"',
        "RC=$code STOP=failed", "exit $RC", 'scontrol requeue "$SLURM_JOB_ID"',
        "PY=/opt/venv/bin/python",
    ]
    missing = [m for m in must if m not in script]
    assert not missing, missing
    assert script.count("&\nSTEPS[$!]=") == 3  # controller, rollout, trainer in the background
    if shutil.which("bash"):
        subprocess.run(["bash", "-n"], input=script, text=True, check=True)


def test_four_nodes_three_train(tmp_path):
    cfg = _cfg(tmp_path, "launcher.nodes=4", "launcher.gen_nodes=1", "launcher.gpus_per_node=8",
               "trainer.batch_size=6", "engine.vllm.tensor_parallel_size=2")
    _, script, _ = build(cfg)
    # 1 generation node / tp 2 = 4 workers; 3 training nodes × 8 GPUs = 24 ranks; 6×4 = 24 samples
    assert (cfg.rollout.workers, cfg.trainer.ranks) == (4, 24)
    for m in ["GEN_NODES=$(list 0 1)", "TRAIN_NODES=$(list 1 3)", "--gpus-per-task=2",
              "--ntasks=4 --ntasks-per-node=4", "--nnodes=3 --nproc-per-node=8", "--ntasks=3"]:
        assert m in script, m


def test_one_cpu_node(tmp_path):
    cfg = _cfg(tmp_path, "rollout.workers=1", "trainer.ranks=1")
    _, script, notes = build(cfg)
    assert notes == [] and "--gres" not in script and "--gpus" not in script
    assert "GEN_NODES=$(list 0 1)" in script and "TRAIN_NODES=$(list 0 1)" in script


@pytest.mark.parametrize("overrides, fix", [
    (["launcher.nodes=1", "launcher.gpus_per_node=1"], "launcher=local"),
    (["launcher.nodes=2", "launcher.gen_nodes=2"], "choose 1..1 generation nodes"),
    (["launcher.nodes=2", "launcher.gpus_per_node=8", "engine.vllm.tensor_parallel_size=3"],
     "does not divide"),
    (["launcher.nodes=3", "launcher.gen_nodes=1", "launcher.gpus_per_node=8",
      "trainer.batch_size=3"],
     "do not split"),
])
def test_bad_layouts_name_the_fix(tmp_path, overrides, fix):
    cfg = _cfg(tmp_path, *overrides)
    with pytest.raises(ValueError, match=fix):
        build(cfg)


def test_layout_of_one_gpu_node_split():
    cfg = compose(["launcher=slurm", "launcher.gpus_per_node=4"])
    lay = slurm_layout(cfg)
    assert (lay.workers, lay.gpus_per_worker, lay.trainer_gpus, lay.shared) == (1, 1, 3, True)


def test_prepare_advertises_hostnames(tmp_path, monkeypatch):
    cfg = compose(["launcher=slurm", f"run_dir={tmp_path}"])
    save_yaml(cfg, tmp_path / "config.yaml")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    (tmp_path / "checkpoints" / "step-1").mkdir(parents=True)
    slurm_job.prepare(tmp_path, "trainer-node-7", 41000, 41001)
    ep = json.loads((tmp_path / "endpoints.json").read_text())
    host = socket.gethostname()
    assert all(ep[k].startswith(f"tcp://{host}:")
               for k in ("work", "results", "batches", "control", "status"))
    assert (ep["weights_host"], ep["weights_port"]) == ("trainer-node-7", 41000)
    assert compose_resume(tmp_path) == str(tmp_path)  # requeued with a checkpoint → resume


def compose_resume(run_dir):
    from areal_cli.runconfig.compose import load_yaml

    return load_yaml(run_dir / "config.yaml").resume


def test_rollout_task_takes_its_gpu_share(monkeypatch):
    seen = {}
    monkeypatch.setenv("SLURM_PROCID", "5")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    monkeypatch.setattr(slurm_job.os, "execv", lambda exe, argv: seen.update(argv=argv))
    slurm_job.rollout("/r", 2)
    assert seen["argv"][-2:] == ["/r", "5"]
    assert slurm_job.os.environ["CUDA_VISIBLE_DEVICES"] == "2,3"


FAKE_SRUN = '#!/bin/bash\nwhile [[ $1 == --* ]]; do shift; done\nexec "$@"\n'  # drop options, run
FAKE_SCONTROL = '#!/bin/bash\n[[ $1 == show ]] && echo node1\nexit 0\n'
FAKE_PY = """#!/bin/bash
case "$*" in
  *slurm_job\\ ports*) echo node1 40001 40002 ;;
  *slurm_job\\ prepare*) ;;
  *controller.main*) exec sleep {controller} ;;
  *slurm_job\\ rollout*) exec sleep {rollout} ;;
  *launcher.torchrun*) sleep 1; exit {trainer} ;;
esac
"""


def _run_with_fake_slurm(tmp_path, controller: str, trainer: int, rollout: str = "60"):
    """The generated script under stand-ins for srun/scontrol/python: its watch loop, for real."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in [("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL),
                       ("python",
                        FAKE_PY.format(controller=controller, trainer=trainer, rollout=rollout))]:
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    cfg = _cfg(tmp_path, "launcher.stop_timeout_s=2")
    plan, script, _ = build(cfg, python=str(bin_dir / "python"))
    plan.run_dir.mkdir(parents=True)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_NODELIST": "node1", "SLURM_JOB_ID": "42",
           "SLURM_CPUS_ON_NODE": "2"}
    out = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True,
                         timeout=60)
    return out, plan.run_dir


@pytest.mark.skipif(not shutil.which("bash"), reason="needs bash")
def test_a_failed_step_fails_the_job(tmp_path):
    out, run_dir = _run_with_fake_slurm(tmp_path, controller="60", trainer=3)
    assert out.returncode == 3, out.stdout + out.stderr
    assert "the trainer step failed (exit code 3)" in out.stderr
    assert (run_dir / "slurm_job_id").read_text().strip() == "42"
    left = subprocess.run(["pgrep", "-f", "sleep 60"], capture_output=True,
                          text=True).stdout.split()
    assert not [p for p in left if (Path(f"/proc/{p}/cwd").resolve() == run_dir)]  # stopped


@pytest.mark.skipif(not shutil.which("bash"), reason="needs bash")
def test_the_controller_ends_the_run(tmp_path):
    out, _ = _run_with_fake_slurm(tmp_path, controller="1", trainer=0, rollout="2")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "the controller finished the run" in out.stdout
