"""Shared fixtures: real victim processes on free loopback ports."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

import pytest
import torch

from fedleak.harness.attacker.client import VictimClient
from fedleak.harness.victim.process import VictimProcess

TOKEN = secrets.token_hex(8)

#: Ray's workers (the Ray sweep tests' cluster, Flower's simulation actors) run at the tests'
#: niceness, not Ray's default +15: at +15 a task gets about 0.4 % of a core beside 18 busy
#: processes at 0 on 2 cores (scheduler weight 36 against 9 x 1,024 per core), so on a
#: machine at a load average of 20 a Ray test is starved, not slowed. Read by every raylet
#: the tests start.
os.environ.setdefault("RAY_worker_niceness", "0")


@pytest.fixture(scope="module")
def victim_process() -> Iterator[VictimProcess]:
    """A lenet-zhu victim on the bundled photos, reveal enabled, 1 MiB message limit."""
    args = ["--dataset", "photos", "--split", "all", "--images", "0-3", "--model", "lenet-zhu",
            "--batch-size", "2", "--allow-reveal", "--max-message-mb", "1"]
    with VictimProcess(args, token=TOKEN) as proc:
        yield proc


@pytest.fixture()
def client(victim_process: VictimProcess) -> Iterator[VictimClient]:
    with VictimClient(victim_process.address, token=TOKEN, max_message_bytes=64 << 20,
                      timeout=60) as c:
        yield c


@pytest.fixture()
def one_torch_thread() -> Iterator[None]:
    """Tiny tensors: one thread is as fast, and immune to OpenMP barriers on a busy machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# Files whose tests start or attach to a Ray cluster (Flower's simulation backend attaches to a
# running one, and the Ray sweep tests find and kill Ray's worker processes by name): under
# pytest-xdist (`make test` runs `-n 2`) they must share one worker, so no two of them ever run
# at once. xdist's own `--dist loadgroup` cannot do it with pytest 9 (it renames `item._nodeid`,
# which pytest 9 no longer reads), so this scheduler does: every other test is a scope of its
# own (load balancing, as `--dist load`), and these files are one scope, sent to one worker.
_ONE_RAY_CLUSTER = frozenset({"test_flower.py", "test_flower_text.py", "test_sweep_ray.py"})
RAY_CLUSTER_SCOPE = "ray-cluster"
# Files whose module-scoped fixture is dear (a pretrained model loaded, a victim process started,
# a compiled step the file's tests share through the compile cache):
# each is one scope, so its fixture is built once on one worker rather than once per worker.
_ONE_WORKER_PER_FILE = frozenset({"test_pretrained_models.py", "test_fuzz_services.py",
                                  "test_text_victim.py", "test_victim_service.py",
                                  "test_kkt_release.py", "test_compiled.py"})


def ray_cluster_scope(nodeid: str) -> str:
    """A test's scheduling scope: the Ray files share one, a dear-fixture file is one."""
    path = nodeid.split("::", 1)[0]
    file = path.rsplit("/", 1)[-1]
    if file in _ONE_RAY_CLUSTER:
        return RAY_CLUSTER_SCOPE
    return path if file in _ONE_WORKER_PER_FILE else nodeid


@pytest.hookimpl(optionalhook=True)  # `-p no:xdist` runs without the hook
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    from xdist.scheduler import LoadScopeScheduling

    class OneRayCluster(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return ray_cluster_scope(nodeid)

    return OneRayCluster(config, log)
