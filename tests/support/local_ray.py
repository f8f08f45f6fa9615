"""A local Ray for the tests: on 127.0.0.1, no dashboard, no usage report, this checkout importable
by the workers (they are separate processes and find it through PYTHONPATH)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def start_local_ray(ray: Any, repo_root: Path, num_cpus: int = 2) -> None:
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # never report to the network
    paths = [str(repo_root), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
             _node_ip_address="127.0.0.1", configure_logging=False)
