"""What a lying remote defense's reply costs the victim before its refusal (issue 50).

A ``DefenseService`` in its own process answers every ``Defend`` with a reply of 4 GiB in
1 MiB chunks, two ways: ``declared`` — the tensor's header declares 4 GiB ([2³⁰] float32)
instead of the shape sent; ``overlong`` — the header is the one sent, the bytes go on past it.
This process plays the victim's side (the ``remote`` link's ``apply`` on a 4 MB update) and
prints its peak resident memory above the level before the call (``VmHWM`` reset through
``/proc/self/clear_refs``, Linux), the chunks the service got to send, and the refusal.
Target: < 100 MB.

    OMP_NUM_THREADS=1 python bench/lying_reply.py
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedleak.defenses import create_defense  # noqa: E402
from fedleak.harness.wire.request_errors import FailedPrecondition  # noqa: E402

SERVICE = '''
import sys, time
from concurrent import futures
import grpc
from fedleak.harness.remote_defense.wire import assemble_update
from fedleak.v1 import defense_pb2 as dpb, defense_pb2_grpc as dpb_grpc, victim_pb2 as pb
mode = sys.argv[1]
class Liar(dpb_grpc.DefenseServiceServicer):
    def Info(self, request, context):
        return dpb.DefenseInfo(name="liar", stage="update")
    def Defend(self, request_iterator, context):
        sent = assemble_update(request_iterator)
        shape = [1 << 30] if mode == "declared" else list(sent.tensors[0].shape)
        chunk = bytes(1 << 20)
        for i in range(4096):  # 4 GiB
            if not context.is_active():
                break
            yield dpb.UpdateChunk(piece=pb.Tensor(name="w", dtype=pb.FLOAT32, shape=shape,
                                                  data=chunk), offset=i << 20)
server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
dpb_grpc.add_DefenseServiceServicer_to_server(Liar(), server)
print(server.add_insecure_port("127.0.0.1:0"), flush=True)
server.start()
server.wait_for_termination()
'''


def _status(key: str) -> float:
    line = next(r for r in Path("/proc/self/status").read_text().splitlines()
                if r.startswith(key))
    return int(line.split()[1]) / 1024


def main() -> None:
    torch.set_num_threads(1)
    update = [torch.randn(1 << 20)]  # 4 MB
    for mode in ("declared", "overlong"):
        service = subprocess.Popen([sys.executable, "-c", SERVICE, mode], text=True,
                                   stdout=subprocess.PIPE, env={"PYTHONPATH": str(ROOT)})
        try:
            port = int(service.stdout.readline())  # type: ignore[union-attr]
            remote = create_defense("remote", {"address": f"127.0.0.1:{port}"})
            remote.bind(["w"])
            Path("/proc/self/clear_refs").write_text("5")  # reset the peak to now
            before = _status("VmRSS")
            started = time.perf_counter()
            try:
                remote.apply(update, torch.Generator())
                said = "ACCEPTED"
            except FailedPrecondition as err:
                said = str(err)
            took = time.perf_counter() - started
            cost = _status("VmHWM") - before
        finally:
            service.kill()
            service.wait()
        verdict = "target met" if cost < 100 and said != "ACCEPTED" else "TARGET MISSED"
        print(f"lying reply ({mode}, 4 GiB in 1 MiB chunks; {verdict}): the victim's peak RSS "
              f"+{cost:.0f} MB over {before:.0f} MB, refused in {took:.2f} s: {said[:160]}")


if __name__ == "__main__":
    main()
