"""Run slicetrain on a Ray cluster: reserve the slice as a placement group (one bundle per host),
start one actor per host that runs `slicetrain launch` with that host's index and the master
address, stream its output to the driver and return the final metrics.

Install: `pip install <slicetrain>/deploy` (or <prefix>/share/slicetrain/deploy of an installed
slicetrain); it finds the slicetrain binary on PATH (or --slicetrain-bin / $SLICETRAIN_BIN).
Usage (what `ray job submit -- ...` runs on the head node):
    slicetrain-ray [adapter options] finetune|collectives|evaluate [slicetrain flags]
    python -m slicetrain_ray ...   (the same)
See docs/deploy.md. Ray is used for placement only; the workers talk to each other through
slicetrain's own store and Gloo, as with any other launcher.
"""

from .adapter import (
    HostPlan,
    JobResult,
    SliceShape,
    main,
    parse_final_metrics,
    plan_slice,
    resolve_binary,
    run_job,
)

__all__ = [
    "HostPlan",
    "JobResult",
    "SliceShape",
    "main",
    "parse_final_metrics",
    "plan_slice",
    "resolve_binary",
    "run_job",
]
