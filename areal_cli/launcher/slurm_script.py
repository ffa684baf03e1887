"""The sbatch script of a run: one job, one ``srun`` step per role, watched by the batch shell.

Inside the job (the batch shell runs on node 0):
1. a one-task step on the first training node prints its hostname and two free ports
   (torchrun rendezvous, weight-broadcast TCPStore);
2. ``python -m areal_cli.launcher.slurm_job prepare`` rewrites ``endpoints.json`` with the
   hostname of node 0 (the controller binds every ZeroMQ socket there);
3. steps: controller on node 0; rollout workers on the generation nodes (one task per
   worker, its GPUs bound by ``--gpus-per-task``); one torchrun per training node joined by
   the c10d rendezvous on the first training node (``launcher/torchrun.py``: its stores listen
   on that node's address only);
4. the shell polls the steps: the first failed step stops the others and fails the job
   with its exit code; the controller's clean exit ends the run.
Every step runs with ``--overlap`` (steps share CPUs and memory; GPUs stay per step).
``scancel`` signals every step; the time-limit warning (USR1 to the batch shell only)
stops the steps with SIGTERM — they checkpoint — and requeues the job.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from areal_cli.config.schema import RootConfig
from areal_cli.launcher.slurm_layout import SlurmLayout

_HEAD = """#!/bin/bash
# areal run {run_dir} — written by `areal train launcher=slurm`.
# {summary}
{sbatch}
set -uo pipefail
RUN_DIR={q_run_dir}
PY={q_py}
cd "$RUN_DIR" || exit 1
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false TRANSFORMERS_VERBOSITY=error
export HF_HUB_OFFLINE="${{HF_HUB_OFFLINE:-1}}" TORCH_NCCL_ASYNC_ERROR_HANDLING=1
{setup}
echo "$SLURM_JOB_ID" > "$RUN_DIR/slurm_job_id"
mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
list() {{ local IFS=,; echo "${{NODES[*]:$1:$2}}"; }}
HEAD=${{NODES[0]}}                  # controller: binds every ZeroMQ endpoint
GEN_NODES=$(list {gen0} {n_gen})      # rollout workers
TRAIN_NODES=$(list {train0} {n_train})    # torchrun, one agent per node
echo "areal: job $SLURM_JOB_ID on ${{NODES[*]}} (restart ${{SLURM_RESTART_COUNT:-0}}): \
controller $HEAD, rollout $GEN_NODES, trainer $TRAIN_NODES"

# hostname + free ports of the first training node: torchrun rendezvous, weight TCPStore
read -r TRAIN_HOST RDZV_PORT WEIGHTS_PORT < <(srun --overlap --nodes=1 --ntasks=1 \\
  --nodelist="${{NODES[{train0}]}}"{nogpu} "$PY" -m areal_cli.launcher.slurm_job ports)
[[ -n "${{WEIGHTS_PORT:-}}" ]] || {{ echo "areal: no ports from ${{NODES[{train0}]}}" >&2; \
exit 1; }}
# endpoints.json advertised by this node's hostname; resume after a requeue
"$PY" -m areal_cli.launcher.slurm_job prepare "$RUN_DIR" "$TRAIN_HOST" "$WEIGHTS_PORT" \
"$RDZV_PORT" || exit 1
"""

_STEPS = """
declare -A STEPS=()  # srun pid → role
SRUN=(srun --overlap --kill-on-bad-exit=1 --open-mode=append)
"${{SRUN[@]}}" --nodes=1 --ntasks=1 --nodelist="$HEAD"{nogpu} --cpus-per-task=1 \\
  --output="$RUN_DIR/logs/controller.log" \\
  "$PY" -m areal_cli.controller.main "$RUN_DIR" &
STEPS[$!]=controller
"${{SRUN[@]}}" --nodes={n_gen} --nodelist="$GEN_NODES" --ntasks={workers} --ntasks-per-node={wpn} \\
  {rollout_gpus}--cpus-per-task=$(( SLURM_CPUS_ON_NODE / {wpn} > 0 ? \
SLURM_CPUS_ON_NODE / {wpn} : 1 )) \\
  --output="$RUN_DIR/logs/rollout-%t.log" \\
  "$PY" -m areal_cli.launcher.slurm_job rollout "$RUN_DIR" {gpw} &
STEPS[$!]=rollout
"${{SRUN[@]}}" --nodes={n_train} --nodelist="$TRAIN_NODES" --ntasks={n_train} --ntasks-per-node=1 \\
  {trainer_gpus}--cpus-per-task=$SLURM_CPUS_ON_NODE --output="$RUN_DIR/logs/torchrun-%N.log" \\
  "$PY" -m areal_cli.launcher.torchrun --nnodes={n_train} --nproc-per-node={nproc} \
--max-restarts=0 \\
  --rdzv-backend=areal-c10d --rdzv-endpoint="$TRAIN_HOST:$RDZV_PORT" --rdzv-id="$SLURM_JOB_ID" \\
  -m areal_cli.trainer.main "$RUN_DIR" &
STEPS[$!]=trainer
"""

_WATCH = """
STOP="" RC=0 DEADLINE=0
trap 'STOP=timelimit' USR1   # --signal: {signal_s}s before the time limit (batch shell only)
trap 'STOP=cancelled RC=143' TERM INT
stop_steps() {{  # SIGTERM every step (srun forwards it to its tasks); SIGKILL after $1 s
  local pid
  for pid in "${{!STEPS[@]}}"; do kill -TERM "$pid" 2>/dev/null; done
  for ((i = 0; i < $1; i++)); do
    local alive=0
    for pid in "${{!STEPS[@]}}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    ((alive)) || return 0
    sleep 1
  done
  for pid in "${{!STEPS[@]}}"; do kill -KILL "$pid" 2>/dev/null; done
}}
while ((${{#STEPS[@]}})) && [[ -z $STOP ]]; do
  for pid in "${{!STEPS[@]}}"; do
    kill -0 "$pid" 2>/dev/null && continue
    wait "$pid"; code=$?; role=${{STEPS[$pid]}}; unset "STEPS[$pid]"
    if ((code)); then
      echo "areal: the $role step failed (exit code $code); stopping the others" >&2
      RC=$code STOP=failed; break
    elif [[ $role == controller ]]; then
      echo "areal: the controller finished the run"; DEADLINE=$((SECONDS + {drain_s}))
    fi
  done
  ((DEADLINE && SECONDS > DEADLINE)) && STOP=finished
  sleep 1 & wait $!
done
case $STOP in
  timelimit) stop_steps {ckpt_s}; {requeue} ;;
  "") ;;
  *) stop_steps {stop_s} ;;
esac
exit $RC
"""


def sbatch_header(cfg: RootConfig, lay: SlurmLayout, run_dir: Path) -> list[str]:
    lc = cfg.launcher
    lines = [f"--job-name=areal-{run_dir.name}", f"--nodes={lay.nodes}", "--exclusive",
             f"--time={lc.time}", f"--output={run_dir}/logs/slurm-%j.out", "--open-mode=append",
             f"--signal=B:USR1@{lc.signal_s}"]
    if lc.gpus_per_node:
        lines.append(f"--gpus-per-node={lc.gpus_per_node}")
    if lc.partition:
        lines.append(f"--partition={lc.partition}")
    if lc.account:
        lines.append(f"--account={lc.account}")
    lines.append("--requeue" if lc.requeue else "--no-requeue")
    lines += [str(x) for x in lc.sbatch_args]
    return [f"#SBATCH {x}" for x in lines]


def render_sbatch(cfg: RootConfig, lay: SlurmLayout, run_dir: Path, python: str) -> str:
    """The whole sbatch script for ``cfg`` laid out as ``lay``."""
    lc = cfg.launcher
    n_gen = lay.gen_nodes[1] - lay.gen_nodes[0]
    n_train = lay.train_nodes[1] - lay.train_nodes[0]
    gpu = lc.gpus_per_node > 0
    summary = (f"{lay.nodes} node(s) × {lc.gpus_per_node or 'CPU'} GPU(s): {lay.workers} rollout "
               f"worker(s) on {n_gen} node(s), {lay.trainer_world} trainer rank(s) on {n_train} "
               "node(s)"
               + (" (one node shared)" if lay.shared else ""))
    head = _HEAD.format(
        run_dir=run_dir, summary=summary, sbatch="\n".join(sbatch_header(cfg, lay, run_dir)),
        q_run_dir=shlex.quote(str(run_dir)), q_py=shlex.quote(python),
        setup="\n".join(str(x) for x in lc.setup), gen0=lay.gen_nodes[0], n_gen=n_gen,
        train0=lay.train_nodes[0], n_train=n_train, nogpu=" --gres=none" if gpu else "")
    steps = _STEPS.format(
        nogpu=" --gres=none" if gpu else "", n_gen=n_gen, workers=lay.workers,
        wpn=lay.workers_per_node,
        rollout_gpus=f"--gpus-per-task={lay.gpus_per_worker} " if gpu else "",
        gpw=lay.gpus_per_worker,
        n_train=n_train, nproc=lay.trainer_nproc,
        trainer_gpus=f"--gpus-per-node={lay.trainer_gpus} " if gpu else "")
    requeue = ('scontrol requeue "$SLURM_JOB_ID"; echo "areal: requeued"' if lc.requeue
               else 'echo "areal: stopped at the time limit (launcher.requeue=false)"')
    watch = _WATCH.format(signal_s=lc.signal_s, drain_s=max(30, int(lc.stop_timeout_s) * 4),
                          ckpt_s=max(10, lc.signal_s - 30), stop_s=max(1, int(lc.stop_timeout_s)),
                          requeue=requeue)
    return head + steps + watch
