"""The Ray adapter of slicetrain (see __init__.py for what it is and docs/deploy.md for how to use it).

What it does, in order:
  1. reads the slice from slicetrain's own flags (--topology, --accelerator-type), or the
     adapter's --num-hosts / --nproc-per-node;
  2. reserves one placement-group bundle per host: Ray's TPU slice helper
     (ray.util.tpu.slice_placement_group) for TPU-* accelerators, else `--bundle` resources with
     STRICT_SPREAD (one bundle per node);
  3. starts one HostRunner actor per bundle; host ranks follow TPU_WORKER_ID where the KubeRay TPU
     webhook set it (so ranks follow the slice's physical order), else the bundle order;
  4. rank 0's node address is MASTER_ADDR; a free port on it (or --master-port) is MASTER_PORT;
     a fresh random job secret is SLICETRAIN_SECRET (never printed);
  5. every actor runs `slicetrain launch --nnodes N --node-rank i --nproc-per-node P
     --master-addr A --master-port X -- <command>` and streams its output lines back, which the
     driver prints prefixed with `[host i]`;
  6. the job succeeds when every host exits 0; the final metrics come from the
     `Training completed! Final metrics: {...}` line. A host that fails stops the others (after a
     short grace, in which they usually fail by themselves on the lost peer) and fails the job with a
     message naming the host and its last lines.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

# Subcommands that run over the whole slice, and slicetrain's default slice for each.
SLICE_COMMANDS = {
    "finetune": ("2", "CPU"),
    "collectives": ("4x4", "TPU-V6E"),
}
# Driver environment variables passed on to every host's `slicetrain launch`.
FORWARDED_ENV = (
    "STORAGE_PATH",
    "HF_TOKEN",
    "HF_ENDPOINT",
    "HF_HOME",
    "HF_HUB_CACHE",
    "HF_HUB_OFFLINE",
    "SLICETRAIN_TIMEOUT_MS",
    "SLICETRAIN_DATA_DIR",
)
# Variables a launcher must not inherit from the actor's process: they would make `slicetrain
# launch` believe it is itself one worker of some other job.
CLEARED_ENV = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "NNODES",
    "MASTER_ADDR",
    "MASTER_PORT",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
)
FINAL_METRICS = re.compile(r"Training completed! Final metrics: (\{.*\})\s*$")
COLLECTIVES_SUMMARY = re.compile(r"All \d+ slicetrain ranks verified .*$")


class AdapterError(RuntimeError):
    """An expected failure (bad flags, no resources, a host failed): one clear line for the user."""


@dataclass
class SliceShape:
    accelerator_type: str  # as slicetrain spells it: "CPU", "TPU-V6E", "GPU-H100"
    topology: str
    num_hosts: Optional[int]  # None: from Ray's TPU slice helper once reserved
    nproc_per_node: Optional[int]

    @property
    def is_tpu(self) -> bool:
        return self.accelerator_type.upper().startswith("TPU")

    @property
    def is_gpu(self) -> bool:
        return self.accelerator_type.upper().startswith("GPU")


@dataclass
class HostPlan:
    """What one host runs: its rank among hosts, its address, and the launch command."""

    node_rank: int
    bundle_index: int
    ip: str
    argv: List[str]
    env: Dict[str, str]


@dataclass
class JobResult:
    exit_codes: List[int]  # by node rank
    metrics: Optional[dict] = None  # parsed final metrics (finetune)
    summary: Optional[str] = None  # the collectives summary line
    failed_host: int = -1
    message: str = ""
    hosts: List[str] = field(default_factory=list)  # by node rank

    @property
    def ok(self) -> bool:
        return bool(self.exit_codes) and all(c == 0 for c in self.exit_codes)


def resolve_binary(name: str) -> Optional[str]:
    """The slicetrain executable `name` names on this host: a path as given, else the first match
    on PATH (an installed slicetrain: the .deb's /usr/bin, or `cmake --install`'s prefix/bin);
    None when there is none or it is not executable."""
    exe = name if os.path.sep in name else shutil.which(name)
    return exe if exe and os.access(exe, os.X_OK) else None


def slicetrain_flag(args: Sequence[str], name: str) -> Optional[str]:
    """The value of `--name V` or `--name=V` in slicetrain's own flags (last one wins)."""
    value = None
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith(name + "="):
            value = a[len(name) + 1 :]
    return value


def plan_slice(
    command: Sequence[str], num_hosts: Optional[int] = None, nproc_per_node: Optional[int] = None
) -> SliceShape:
    """The slice of `command` (["finetune", "--topology", "2x1", ...]); explicit counts win."""
    if not command:
        raise AdapterError("nothing to run: give a slicetrain subcommand, e.g. `finetune --num-epochs 1`")
    sub, flags = command[0], list(command[1:])
    topo_default, acc_default = SLICE_COMMANDS.get(sub, ("1", "CPU"))
    topology = slicetrain_flag(flags, "--topology") or topo_default
    acc = slicetrain_flag(flags, "--accelerator-type") or acc_default
    shape = SliceShape(acc, topology, num_hosts, nproc_per_node)
    if shape.is_tpu:
        return shape  # Ray's slice helper knows hosts and chips per host
    dims = topology.lower().split("x")
    try:
        ints = [int(d) for d in dims]
    except ValueError:
        raise AdapterError(f"topology '{topology}' of {acc} is not D or HxD") from None
    if len(ints) == 1:
        hosts, per_host = 1, ints[0]
    elif len(ints) == 2:
        hosts, per_host = ints
    else:
        raise AdapterError(f"topology '{topology}' of {acc} is not D or HxD")
    if shape.num_hosts is None:
        shape.num_hosts = hosts
    if shape.nproc_per_node is None:
        shape.nproc_per_node = per_host
    if shape.num_hosts < 1 or shape.nproc_per_node < 1:
        raise AdapterError(f"need at least one host and one worker per host (topology '{topology}')")
    return shape


def default_bundle(shape: SliceShape) -> Dict[str, float]:
    if shape.is_gpu:
        return {"CPU": 1, "GPU": float(shape.nproc_per_node or 1)}
    return {"CPU": 1}


def launch_argv(
    slicetrain_bin: str,
    node_rank: int,
    num_hosts: int,
    nproc_per_node: int,
    master_addr: str,
    master_port: int,
    command: Sequence[str],
) -> List[str]:
    return [
        slicetrain_bin,
        "launch",
        "--nnodes",
        str(num_hosts),
        "--node-rank",
        str(node_rank),
        "--nproc-per-node",
        str(nproc_per_node),
        "--master-addr",
        master_addr,
        "--master-port",
        str(master_port),
        "--",
        *command,
    ]


def assign_node_ranks(infos: Sequence[dict]) -> List[int]:
    """Bundle indices in node-rank order: by TPU_WORKER_ID when every host has a distinct one in
    0..N-1 (the TPU webhook's order, which is the slice's physical order), else bundle order."""
    ids = [info.get("tpu_worker_id") for info in infos]
    if all(i is not None for i in ids):
        try:
            as_int = [int(i) for i in ids]
        except ValueError:
            as_int = []
        if sorted(as_int) == list(range(len(infos))):
            return sorted(range(len(infos)), key=lambda b: as_int[b])
    return list(range(len(infos)))


def parse_final_metrics(line: str) -> Optional[dict]:
    m = FINAL_METRICS.search(line)
    if not m:
        return None
    try:
        value = ast.literal_eval(m.group(1))
    except (ValueError, SyntaxError):
        return None
    return value if isinstance(value, dict) else None


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the actor process dies (Linux), so a killed actor
    never leaves a launcher behind; the launcher then stops its workers."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass
    os.setsid()


class HostRunner:
    """One per host (a Ray actor): reports where it is, and runs that host's `slicetrain launch`."""

    def __init__(self) -> None:
        self._proc: Optional[subprocess.Popen] = None
        self._lock = threading.Lock()
        self._stopped = False

    def info(self) -> dict:
        import ray

        return {
            "ip": ray.util.get_node_ip_address(),
            "hostname": socket.gethostname(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "tpu_worker_id": os.environ.get("TPU_WORKER_ID") or None,
            "tpu_name": os.environ.get("TPU_NAME") or None,
        }

    def free_port(self) -> int:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            return int(s.getsockname()[1])

    def run(self, argv: List[str], env: Dict[str, str]):
        """Yields the launcher's output lines (stdout and stderr, in order), then
        {"exit_code": rc}."""
        exe = resolve_binary(argv[0])
        if not exe:
            yield (
                f"slicetrain_ray: '{argv[0]}' not found or not executable on {socket.gethostname()}: "
                "install slicetrain there (the .deb, or cmake --install) or pass --slicetrain-bin"
            )
            yield {"exit_code": 127}
            return
        full_env = {k: v for k, v in os.environ.items() if k not in CLEARED_ENV}
        full_env.update(env)
        with self._lock:
            if self._stopped:
                yield {"exit_code": 143}
                return
            self._proc = subprocess.Popen(
                [exe, *argv[1:]],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=full_env,
                text=True,
                errors="replace",
                bufsize=1,
                preexec_fn=_die_with_parent,
            )
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            yield line.rstrip("\n")
        yield {"exit_code": self._proc.wait()}

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM to the launcher (it forwards to its workers), SIGKILL to its session after
        `grace_s`."""
        with self._lock:
            self._stopped = True
            proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        try:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        except ProcessLookupError:
            pass


def _reserve(ray, shape: SliceShape, bundle: Optional[Dict[str, float]], timeout_s: float):
    """Returns (placement_group, release_fn, num_hosts, nproc_per_node)."""
    from ray.util.placement_group import placement_group, remove_placement_group

    if shape.is_tpu:
        from ray.util.tpu import get_tpu_version_from_type, slice_placement_group

        version = get_tpu_version_from_type(shape.accelerator_type.upper())
        handle = slice_placement_group(topology=shape.topology, accelerator_version=version)
        pg = handle.placement_group
        hosts = handle.num_hosts
        # slicetrain's workers per host: one per chip, two on TPU7x (two chiplets per chip).
        per_chip = 2 if version.lower() in ("v7x", "tpu7x") else 1
        nproc = shape.nproc_per_node or handle.chips_per_host * per_chip
        if shape.num_hosts is not None and shape.num_hosts != hosts:
            handle.shutdown()
            raise AdapterError(
                f"--num-hosts {shape.num_hosts} contradicts {shape.accelerator_type} {shape.topology}: {hosts} hosts"
            )
        release = handle.shutdown
        what = f"TPU slice {shape.accelerator_type} {shape.topology} ({hosts} hosts)"
    else:
        hosts = shape.num_hosts or 1
        nproc = shape.nproc_per_node or 1
        b = bundle or default_bundle(shape)
        # STRICT_SPREAD: every bundle on a different node (one node = one host).
        pg = placement_group([dict(b) for _ in range(hosts)], strategy="STRICT_SPREAD" if hosts > 1 else "PACK")
        release = lambda: remove_placement_group(pg)  # noqa: E731
        what = f"{hosts} hosts with {b} each (STRICT_SPREAD)"
    ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
    if not ready:
        available = ray.available_resources()
        release()
        raise AdapterError(
            f"could not reserve {what} within {timeout_s:.0f} s; the cluster has {available} free"
        )
    return pg, release, hosts, nproc


def run_job(
    command: Sequence[str],
    *,
    slicetrain_bin: str = "slicetrain",
    num_hosts: Optional[int] = None,
    nproc_per_node: Optional[int] = None,
    bundle: Optional[Dict[str, float]] = None,
    master_port: int = 0,
    reserve_timeout_s: float = 600.0,
    stop_grace_s: float = 10.0,
    out: Callable[[str], None] = print,
) -> JobResult:
    """Runs `slicetrain <command>` over the slice on the connected Ray cluster (ray.init() first)."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    # The host actors' class travels by value, so the hosts need Ray but not this package.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    shape = plan_slice(command, num_hosts, nproc_per_node)
    pg, release, hosts, nproc = _reserve(ray, shape, bundle, reserve_timeout_s)
    runner_cls = ray.remote(num_cpus=0, max_concurrency=3, max_restarts=0)(HostRunner)
    actors = []
    try:
        actors = [
            runner_cls.options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=pg, placement_group_bundle_index=b
                )
            ).remote()
            for b in range(hosts)
        ]
        infos = ray.get([a.info.remote() for a in actors])
        order = assign_node_ranks(infos)  # order[node_rank] = bundle index
        master = infos[order[0]]["ip"]
        port = master_port or ray.get(actors[order[0]].free_port.remote())
        secret = secrets.token_hex(16)
        forwarded = {k: os.environ[k] for k in FORWARDED_ENV if os.environ.get(k)}
        plans = []
        for rank, b in enumerate(order):
            env = dict(forwarded)
            env.update({"SLICETRAIN_SECRET": secret, "SLICETRAIN_HOST_IP": infos[b]["ip"]})
            argv = launch_argv(slicetrain_bin, rank, hosts, nproc, master, port, command)
            plans.append(HostPlan(rank, b, infos[b]["ip"], argv, env))
        out(
            f"slicetrain_ray: {hosts} hosts x {nproc} workers ({shape.accelerator_type} {shape.topology}); "
            f"master {master}:{port}; hosts "
            + ", ".join(f"{p.node_rank}={p.ip}" + (f"/tpu{infos[p.bundle_index]['tpu_worker_id']}" if infos[p.bundle_index]['tpu_worker_id'] else "") for p in plans)
        )
        return _run_hosts(ray, actors, plans, stop_grace_s, out)
    finally:
        for a in actors:
            try:
                ray.kill(a)
            except Exception:  # already gone
                pass
        try:
            release()
        except Exception:
            pass


def _run_hosts(ray, actors, plans: List[HostPlan], stop_grace_s: float, out) -> JobResult:
    n = len(plans)
    result = JobResult(exit_codes=[-1] * n, hosts=[p.ip for p in plans])
    tails: List[List[str]] = [[] for _ in range(n)]
    print_lock = threading.Lock()
    first_failure = threading.Event()
    fail_order: List[int] = []  # node ranks in the order they failed: the first is the cause
    done = [threading.Event() for _ in range(n)]

    def consume(p: HostPlan) -> None:
        actor = actors[p.bundle_index]
        try:
            gen = actor.run.options(num_returns="streaming").remote(p.argv, p.env)
            for ref in gen:
                item = ray.get(ref)
                if isinstance(item, dict):
                    result.exit_codes[p.node_rank] = int(item.get("exit_code", 1))
                    continue
                tails[p.node_rank] = (tails[p.node_rank] + [item])[-5:]
                metrics = parse_final_metrics(item)
                if metrics is not None:
                    result.metrics = metrics
                summary = COLLECTIVES_SUMMARY.search(item)
                if summary:
                    result.summary = summary.group(0)
                with print_lock:
                    out(f"[host {p.node_rank}] {item}")
        except Exception as e:  # the actor or its node died
            tails[p.node_rank].append(f"slicetrain_ray: host actor failed: {e}")
            result.exit_codes[p.node_rank] = 1
        if result.exit_codes[p.node_rank] != 0:
            with print_lock:
                fail_order.append(p.node_rank)
            first_failure.set()
        done[p.node_rank].set()

    threads = [threading.Thread(target=consume, args=(p,), daemon=True) for p in plans]
    for t in threads:
        t.start()
    while not all(d.is_set() for d in done):
        if first_failure.wait(timeout=0.5):
            # The others usually fail by themselves on the lost peer; give them a moment to say so.
            deadline = time.monotonic() + stop_grace_s
            while time.monotonic() < deadline and not all(d.is_set() for d in done):
                time.sleep(0.2)
            for p in plans:
                if not done[p.node_rank].is_set():
                    try:
                        ray.get(actors[p.bundle_index].stop.remote(), timeout=30)
                    except Exception:
                        pass
            for t in threads:
                t.join(timeout=60)
            break
    for t in threads:
        t.join(timeout=60)
    failed = [p.node_rank for p in plans if result.exit_codes[p.node_rank] != 0]
    if failed:
        first = fail_order[0] if fail_order else failed[0]
        result.failed_host = first
        last = " | ".join(tails[first][-3:])
        result.message = (
            f"host {first} ({plans[first].ip}) failed first, exit code {result.exit_codes[first]}; "
            f"hosts not exiting 0: {failed}; its last lines: {last}"
        )
    return result


def _parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m slicetrain_ray",
        description="Run a slicetrain subcommand over a slice reserved on the connected Ray cluster.",
        epilog="Everything from the subcommand on is passed to slicetrain unchanged, e.g. "
        "`python -m slicetrain_ray finetune --topology 4x4 --accelerator-type TPU-V6E --storage-path /mnt/ckpt`.",
    )
    p.add_argument("--address", default=None, help="Ray address (default: RAY_ADDRESS / the local cluster)")
    p.add_argument(
        "--slicetrain-bin",
        default=os.environ.get("SLICETRAIN_BIN", "slicetrain"),
        help="slicetrain executable on every host (default: $SLICETRAIN_BIN, else `slicetrain` on PATH)",
    )
    p.add_argument("--num-hosts", type=int, default=None, help="hosts (default: from --topology)")
    p.add_argument("--nproc-per-node", type=int, default=None, help="workers per host (default: from --topology)")
    p.add_argument(
        "--bundle",
        default=None,
        help='resources of one host\'s bundle as JSON, e.g. \'{"CPU": 8, "GPU": 8}\' (not TPU; '
        'default {"CPU": 1}, GPU: {"CPU": 1, "GPU": workers per host})',
    )
    p.add_argument("--master-port", type=int, default=0, help="rendezvous port (default: a free one on host 0)")
    p.add_argument("--reserve-timeout-s", type=float, default=600.0, help="wait for the slice this long")
    p.add_argument("--stop-grace-s", type=float, default=10.0, help="after one host fails, wait this long for the others before stopping them")
    p.add_argument("--result-json", default=None, help="also write the job result (exit codes, metrics) to this file")
    p.add_argument("command", nargs=argparse.REMAINDER, help="slicetrain subcommand and its flags")
    args = p.parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parse_args(sys.argv[1:] if argv is None else argv)
    import ray

    try:
        bundle = json.loads(args.bundle) if args.bundle else None
        if bundle is not None and not isinstance(bundle, dict):
            raise AdapterError("--bundle must be a JSON object of resource amounts")
        ray.init(address=args.address, logging_level="WARNING", log_to_driver=True)
        result = run_job(
            args.command,
            slicetrain_bin=args.slicetrain_bin,
            num_hosts=args.num_hosts,
            nproc_per_node=args.nproc_per_node,
            bundle=bundle,
            master_port=args.master_port,
            reserve_timeout_s=args.reserve_timeout_s,
            stop_grace_s=args.stop_grace_s,
            out=lambda s: print(s, flush=True),
        )
    except (AdapterError, json.JSONDecodeError) as e:
        print(f"slicetrain_ray: error: {e}", file=sys.stderr, flush=True)
        return 2
    if args.result_json:
        with open(args.result_json, "w") as f:
            json.dump(
                {
                    "ok": result.ok,
                    "exit_codes": result.exit_codes,
                    "hosts": result.hosts,
                    "metrics": result.metrics,
                    "summary": result.summary,
                    "message": result.message,
                },
                f,
            )
    if not result.ok:
        print(f"slicetrain_ray: error: the job failed: {result.message}", file=sys.stderr, flush=True)
        return 1
    tail = result.summary or (f"final metrics: {json.dumps(result.metrics)}" if result.metrics else "done")
    print(f"slicetrain_ray: all {len(result.exit_codes)} hosts exited 0; {tail}", flush=True)
    return 0
