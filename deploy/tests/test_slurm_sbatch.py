"""deploy/slurm/finetune.sbatch with a stand-in `srun` that runs the task once per node with the
variables Slurm gives a one-task-per-node step, and a stand-in `slicetrain` that adds --dry-run:
every node's launcher must resolve its host index, the host list and the same store address.
(A real Slurm cluster is not tested here.)"""

import json
import os
import subprocess

from conftest import DEPLOY

SRUN = """#!/usr/bin/env bash
# srun stand-in: drops srun's own options, runs the command once per node of the job.
while [[ "$1" == --* ]]; do shift; done
for ((i = 0; i < SLURM_JOB_NUM_NODES; i++)); do
  SLURM_NODEID=$i SLURM_PROCID=$i SLURM_LOCALID=0 SLURM_NTASKS=$SLURM_JOB_NUM_NODES "$@" || exit $?
done
"""
WRAPPER = """#!/usr/bin/env bash
[ "$1" = launch ] || exit 2
shift
exec "$REAL_SLICETRAIN" launch --dry-run "$@"
"""


def test_sbatch_gives_every_node_its_ranks(slicetrain_bin, tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, text in (("srun", SRUN), ("slicetrain", WRAPPER)):
        (bindir / name).write_text(text)
        (bindir / name).chmod(0o755)
    env = {
        "PATH": f"{bindir}:{os.environ['PATH']}",
        "REAL_SLICETRAIN": slicetrain_bin,
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NUM_NODES": "3",
        "SLURM_JOB_NODELIST": "cpu[07-09]",
        "NPROC_PER_NODE": "2",
    }
    p = subprocess.run(
        ["bash", os.path.join(DEPLOY, "slurm", "finetune.sbatch"), "--num-epochs", "1"],
        env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=120,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    nodes = [json.loads(line) for line in p.stdout.splitlines()]
    assert [n["node_rank"] for n in nodes] == [0, 1, 2]
    for i, n in enumerate(nodes):
        assert n["hosts"] == ["cpu07", "cpu08", "cpu09"] and n["master_addr"] == "cpu07"
        assert n["master_port"] == 20000 + 4242 and n["secret_set"]
        assert n["ranks"] == [2 * i, 2 * i + 1] and n["world_size"] == 6
        assert n["command"] == ["finetune", "--topology", "3x2", "--accelerator-type", "CPU", "--num-epochs", "1"]
        assert "slurm" in n["source"]
