"""The Ray adapter on a real local Ray cluster of three nodes (a head without workers' resources
and two "hosts" with a custom `slicetrain_host` resource, 1 CPU each), started with Ray's own
multi-node test utility. The adapter runs as `ray job submit` would run it: `python -m
slicetrain_ray ...` in a separate driver process connected to the cluster's address.
"""

import json
import os
import subprocess
import sys

import pytest

from conftest import DEPLOY, REPO
from slicetrain_ray import adapter

BUNDLE = json.dumps({"CPU": 1, "slicetrain_host": 1})
MB = 1024 * 1024


# Pure planning: no cluster needed.
def test_plan_slice_from_slicetrain_flags():
    s = adapter.plan_slice(["finetune", "--topology", "2x1", "--accelerator-type", "CPU"])
    assert (s.num_hosts, s.nproc_per_node, s.is_tpu) == (2, 1, False)
    s = adapter.plan_slice(["finetune", "--topology=4x8", "--accelerator-type=GPU-H100"])
    assert (s.num_hosts, s.nproc_per_node, s.is_gpu) == (4, 8, True)
    assert adapter.default_bundle(s) == {"CPU": 1, "GPU": 8.0}
    s = adapter.plan_slice(["finetune"])  # slicetrain's default slice: 2 CPU workers on 1 host
    assert (s.num_hosts, s.nproc_per_node) == (1, 2)
    s = adapter.plan_slice(["collectives"])  # default 4x4 TPU-V6E: Ray's TPU helper decides
    assert s.is_tpu and s.num_hosts is None
    with pytest.raises(adapter.AdapterError):
        adapter.plan_slice(["finetune", "--topology", "2x2x2", "--accelerator-type", "CPU"])
    with pytest.raises(adapter.AdapterError):
        adapter.plan_slice([])


def test_node_ranks_follow_tpu_worker_id_else_bundles():
    infos = [{"tpu_worker_id": "2"}, {"tpu_worker_id": "0"}, {"tpu_worker_id": "3"}, {"tpu_worker_id": "1"}]
    assert adapter.assign_node_ranks(infos) == [1, 3, 0, 2]
    assert adapter.assign_node_ranks([{"tpu_worker_id": None}, {"tpu_worker_id": None}]) == [0, 1]
    assert adapter.assign_node_ranks([{"tpu_worker_id": "0"}, {"tpu_worker_id": "0"}]) == [0, 1]


def test_launch_argv_and_final_metrics():
    argv = adapter.launch_argv("/bin/st", 1, 2, 4, "10.0.0.1", 29500, ["finetune", "--num-epochs", "1"])
    assert argv == [
        "/bin/st", "launch", "--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "4",
        "--master-addr", "10.0.0.1", "--master-port", "29500", "--", "finetune", "--num-epochs", "1",
    ]
    line = "(rank 0 pid=7 ip=10.0.0.1) Training completed! Final metrics: {'epoch': 1, 'loss': 4.5}"
    assert adapter.parse_final_metrics(line) == {"epoch": 1, "loss": 4.5}
    assert adapter.parse_final_metrics("Epoch 1/1 | loss=4.5") is None


@pytest.fixture(scope="module")
def ray_cluster():
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        connect=False,
        head_node_args={"num_cpus": 0, "object_store_memory": 100 * MB, "include_dashboard": False},
    )
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=1, resources={"slicetrain_host": 1}, object_store_memory=100 * MB)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        cluster.shutdown()


def run_adapter(cluster, slicetrain_bin, tmp_path, *command, timeout=600):
    result_json = tmp_path / "result.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(DEPLOY, "ray")
    env["SLICETRAIN_TIMEOUT_MS"] = "120000"  # 2 cores shared by 2 hosts' workers and 3 raylets
    argv = [
        sys.executable, "-m", "slicetrain_ray", "--address", cluster.address,
        "--slicetrain-bin", slicetrain_bin, "--bundle", BUNDLE, "--reserve-timeout-s", "120",
        "--result-json", str(result_json), *command,
    ]
    p = subprocess.run(argv, env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=timeout)
    out = p.stdout + p.stderr
    print(out)  # shown by pytest on failure
    result = json.loads(result_json.read_text()) if result_json.exists() else None
    return p.returncode, out, result


def test_collectives_over_two_ray_hosts(ray_cluster, slicetrain_bin, tmp_path):
    rc, out, result = run_adapter(
        ray_cluster, slicetrain_bin, tmp_path,
        "collectives", "--topology", "2x2", "--accelerator-type", "CPU", "--batch-size", "8", "--hidden-dim", "32",
    )
    assert rc == 0, out
    assert result["ok"] and result["exit_codes"] == [0, 0]
    assert result["summary"] == (
        "All 4 slicetrain ranks verified DTensor TP parity (max_abs_diff=0.000000) and all_reduce sum = 10.0"
    )
    # Rank 0's report came back through host 0's stream; ranks 2 and 3 ran on host 1.
    assert "[host 0] (rank 0 " in out
    assert "Rank  2 (worker_id=1, local_rank=0" in out and "Rank  3 (worker_id=1, local_rank=1" in out
    assert "slicetrain_ray: all 2 hosts exited 0" in out


def test_finetune_over_two_ray_hosts(ray_cluster, slicetrain_bin, tmp_path):
    storage = tmp_path / "ckpt"
    rc, out, result = run_adapter(
        ray_cluster, slicetrain_bin, tmp_path,
        "finetune", "--topology", "2x1", "--accelerator-type", "CPU", "--dataset-split", "train[:32]",
        "--num-epochs", "1", "--max-seq-len", "32", "--batch-size-per-device", "2",
        "--storage-path", str(storage), "--run-name", "ray_test", "--progress", "off",
    )
    assert rc == 0, out
    assert result["exit_codes"] == [0, 0]
    assert result["metrics"]["epoch"] == 1
    assert result["metrics"]["loss"] > 0
    assert "Epoch 1/1 | loss=" in out
    ckpts = [d for d in (storage / "ray_test").iterdir() if d.name.startswith("checkpoint_")]
    assert len(ckpts) == 1 and (ckpts[0] / "model.safetensors").exists()


def test_a_failing_host_fails_the_job_with_a_clear_message(ray_cluster, slicetrain_bin, tmp_path):
    # A flag slicetrain rejects on every worker: each host's launch exits non-zero.
    rc, out, result = run_adapter(
        ray_cluster, slicetrain_bin, tmp_path,
        "finetune", "--topology", "2x1", "--accelerator-type", "CPU", "--num-epochs", "0",
    )
    assert rc == 1, out
    assert not result["ok"]
    assert "slicetrain_ray: error: the job failed: host " in out
    # Every host's own output (its launcher's error) was streamed back to the driver.
    assert "[host 0] " in out and "[host 1] " in out


def test_one_lost_host_stops_the_others(ray_cluster, slicetrain_bin, tmp_path):
    # Host 1's "slicetrain" dies at once; host 0 then waits for it at the rendezvous and must be
    # stopped by the adapter after --stop-grace-s, its launcher and workers with it.
    wrapper = tmp_path / "slicetrain-host1-dies"
    wrapper.write_text(
        "#!/usr/bin/env bash\n"
        'case " $* " in *" --node-rank 1 "*) echo "host 1 lost" >&2; exit 3 ;; esac\n'
        f'exec "{slicetrain_bin}" "$@"\n'
    )
    wrapper.chmod(0o755)
    rc, out, result = run_adapter(
        ray_cluster, str(wrapper), tmp_path,
        "--stop-grace-s", "2",
        "collectives", "--topology", "2x1", "--accelerator-type", "CPU", "--hidden-dim", "32",
    )
    assert rc == 1, out
    assert result["exit_codes"][1] == 3 and result["exit_codes"][0] != 0
    assert "the job failed: host 1 (" in out and "failed first, exit code 3" in out
    assert "host 1 lost" in out
