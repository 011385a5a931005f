"""How close the parameter server's runtime is to the machine's limits, measured in one run.

Run under MPI with N+1 ranks (rank 0 the master):

    MPIEXEC_TIMEOUT=600 mpiexec -n 5 python benchmarks/runtime_limits.py --sizes 1000000 11200000

For each model size d (float32) it measures, in the same job:
  * ping-pong: raw MPI point-to-point time of one d-float message between ranks 0 and 1
    (uppercase Send/Recv on contiguous buffers: the limit);
  * the master's per-step cost with workers that answer at once (no compute, no delay): publish
    w, send it to N workers, receive N gradients, decode (pgc-cr: sum and scale), optimizer step,
    using pgc-mpi's own MasterTransport/WorkerTransport and FlatOptimizer;
  * decode throughput (summing N messages into g) against a NumPy copy of the same bytes.
With --servers 1 2 4 the step is also measured with the parameters sharded over K servers
(pgc-train --servers K), every K with the same workers (the world size minus the largest K):
the bytes into each server fall as 1/K, and rank 0's step shows what that buys.
With --wire-dtypes float32 bfloat16 float16 the master's step is also measured with gradient
messages in each wire format (pgc-train --wire-dtype): the workers' messages shrink, the master
widens each one as it adds it in.
The communication efficiency is (2N one-way ping-pong times) / (per-step time minus decode and
update): the bytes a step moves at raw point-to-point speed, over what the runtime took.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from mpi4py import MPI

from pgc_mpi.core.message import Layout, gradient_header
from pgc_mpi.core.shards import shard_bounds
from pgc_mpi.core.wire import WIRE_DTYPES, wire_format
from pgc_mpi.job import shm
from pgc_mpi.learning.optim import FlatOptimizer
from pgc_mpi.runtime.transport import MasterTransport, WorkerTransport, duplicate_world


def polite_barrier(comm: MPI.Comm) -> None:
    """A barrier that sleeps while it waits: MPICH's blocking Barrier spins, and on an
    oversubscribed node spinning ranks would steal the measured ranks' CPU."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(0.001)


def pingpong(comm: MPI.Comm, d: int, reps: int) -> float:
    """Median one-way seconds of a d-float32 message between ranks 0 and 1 (others idle)."""
    buf = np.zeros(d, dtype=np.float32)
    times = []
    polite_barrier(comm)
    for _ in range(reps):
        if comm.rank == 0:
            t = time.perf_counter()
            comm.Send([buf, MPI.FLOAT], dest=1, tag=7)
            comm.Recv([buf, MPI.FLOAT], source=1, tag=7)
            times.append((time.perf_counter() - t) / 2)
        elif comm.rank == 1:
            comm.Recv([buf, MPI.FLOAT], source=0, tag=7)
            comm.Send([buf, MPI.FLOAT], dest=0, tag=7)
    polite_barrier(comm)
    return float(np.median(times)) if times else 0.0


def master_steps(comm: MPI.Comm, d: int, steps: int, poll: float, wire_dtype: str = "float32", servers: int = 1,
                 workers: int | None = None) -> dict[str, float]:
    """Per-step cost of the real master loop with instantly answering workers (float32 model,
    gradient messages in `wire_dtype`), seen by rank 0. With `servers` K > 1 it is pgc-train
    --servers K's: ranks 0..K-1 each run the loop on their shard of the parameters (as they do,
    independently), ranks K..K+workers-1 answer each with its shard (default workers: every
    other rank; the ranks beyond them sit it out)."""
    n = workers if workers is not None else comm.size - servers
    wire = wire_format(wire_dtype, np.float32)
    header = gradient_header(1)
    shards = shard_bounds(d, servers)
    rank = comm.rank
    if servers <= rank < servers + n:
        link = WorkerTransport(comm, Layout(header, d, wire.storage), poll_interval=poll, wire=wire,
                               shards=shards if servers > 1 else None)
        link.put(np.ones(d, dtype=np.float32))
        while (step := link.next_model()) is not None:
            for h in link.headers:
                h["step"] = step
            link.send()
        link.confirm_stop()
        return {}
    if rank >= servers + n:
        return {}
    own = shards[rank]
    link = MasterTransport(comm, n, Layout(header, own.stop - own.start, wire.storage), poll_interval=poll, wire=wire,
                           first_worker=servers)
    w = np.zeros(own.stop - own.start, dtype=np.float32)
    opt = FlatOptimizer(w, "sgd", 0.01)
    for i in range(n):
        link.post(i)
    per_step, decode = [], []
    for t in range(steps):
        began = time.perf_counter()
        link.publish(t, w)
        for i in range(n):
            link.send_model(i)
        g = opt.grad
        g[:] = 0.0
        got, dec = 0, 0.0
        while got < n:
            for i in link.poll(time.monotonic() + 10):
                mark = time.perf_counter()
                g += link.gradient(i)  # streaming decode, as the master does for pgc-cr
                dec += time.perf_counter() - mark
                link.post(i)
                got += 1
        mark = time.perf_counter()
        g *= np.float32(1.0 / (2 * n))
        opt.step()
        dec += time.perf_counter() - mark
        per_step.append(time.perf_counter() - began)
        decode.append(dec)
    link.shutdown(grace=10)
    return {"step": float(np.median(per_step[1:])), "decode_update": float(np.median(decode[1:]))}


def memory_rates(d: int, n: int, reps: int = 5) -> dict[str, float]:
    """GB/s of a NumPy copy and of the decode sum (g += m) over n messages of d floats."""
    src = np.ones((n, d), dtype=np.float32)
    dst = np.zeros(d, dtype=np.float32)
    copy_t, sum_t = [], []
    for _ in range(reps):
        t = time.perf_counter()
        for i in range(n):
            np.copyto(dst, src[i])
        copy_t.append(time.perf_counter() - t)
        t = time.perf_counter()
        for i in range(n):
            dst += src[i]
        sum_t.append(time.perf_counter() - t)
    nbytes = n * d * 4
    return {"copy_GBps": nbytes / min(copy_t) / 1e9, "decode_GBps": nbytes / min(sum_t) / 1e9}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 11_200_000])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--poll-interval", type=float, default=0.0005, help="seconds (pgc-train's --poll-interval)")
    p.add_argument("--servers", type=int, nargs="+", default=[],
                   help="also time the step with the parameters sharded over each of these numbers of servers "
                        "(pgc-train --servers), the first the reference of the ratios, each with the same "
                        "workers: the world size minus the largest (default: none)")
    p.add_argument("--wire-dtypes", nargs="+", default=[], choices=WIRE_DTYPES,
                   help="also time the master's step with gradient messages in these formats, the first the "
                        "reference of the ratios (pgc-train --wire-dtype; default: none)")
    args = p.parse_args()
    comm = duplicate_world()
    shm.unlink_own_segments()  # the job is up: a killed run leaves no MPICH segment behind (pgc_mpi.job.shm)
    n = comm.size - 1
    rows, wire_rows, server_rows = [], [], []
    for d in args.sizes:
        one_way = pingpong(comm, d, args.reps)
        cost = master_steps(comm, d, args.steps, args.poll_interval)
        for wire in args.wire_dtypes:
            narrow = master_steps(comm, d, args.steps, args.poll_interval, wire)
            if comm.rank == 0:
                itemsize = wire_format(wire, "float32").storage.itemsize
                wire_rows.append({"d": d, "wire": wire, "MB_per_message": d * itemsize / 1e6,
                                  "step_ms": narrow["step"] * 1e3, "decode_update_ms": narrow["decode_update"] * 1e3})
        for k in args.servers:
            polite_barrier(comm)
            sharded = master_steps(comm, d, args.steps, args.poll_interval, servers=k,
                                   workers=comm.size - max(args.servers))
            if comm.rank == 0:
                server_rows.append({"d": d, "servers": k, "workers": comm.size - max(args.servers),
                                    "MB_into_each_server": (comm.size - max(args.servers)) * 4 * -(-d // k) / 1e6,
                                    "step_ms": sharded["step"] * 1e3,
                                    "decode_update_ms": sharded["decode_update"] * 1e3})
        if comm.rank == 0:
            comm_time = cost["step"] - cost["decode_update"]
            row = {"d": d, "workers": n, "MB_per_message": d * 4 / 1e6, "pingpong_one_way_ms": one_way * 1e3,
                   "raw_GBps": d * 4 / one_way / 1e9, "step_ms": cost["step"] * 1e3,
                   "decode_update_ms": cost["decode_update"] * 1e3,
                   "comm_efficiency": 2 * n * one_way / comm_time, **memory_rates(d, n)}
            rows.append(row)
        polite_barrier(comm)
    if comm.rank == 0:
        print("| d | workers | MB/msg | ping-pong one way (ms) | raw GB/s | master step (ms) | decode+update (ms) "
              "| comm efficiency | numpy copy GB/s | decode GB/s |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['d']:,} | {r['workers']} | {r['MB_per_message']:.1f} | {r['pingpong_one_way_ms']:.2f} | "
                  f"{r['raw_GBps']:.2f} | {r['step_ms']:.2f} | {r['decode_update_ms']:.2f} | "
                  f"{r['comm_efficiency']:.2f} | {r['copy_GBps']:.2f} | {r['decode_GBps']:.2f} |")
        if wire_rows:
            first = args.wire_dtypes[0]
            print(f"\n| d | wire | MB/msg | master step (ms) | decode+update (ms) | step / {first} step |")
            print("|---|---|---|---|---|---|")
            base = {r["d"]: r["step_ms"] for r in wire_rows if r["wire"] == args.wire_dtypes[0]}
            for r in wire_rows:
                print(f"| {r['d']:,} | {r['wire']} | {r['MB_per_message']:.1f} | {r['step_ms']:.2f} | "
                      f"{r['decode_update_ms']:.2f} | {r['step_ms'] / base[r['d']]:.2f} |")
        if server_rows:
            first = args.servers[0]
            print(f"\n| d | servers | workers | MB into each server per step | step (ms) | decode+update (ms) "
                  f"| step / {first} server{'s' if first > 1 else ''} |")
            print("|---|---|---|---|---|---|---|")
            base = {r["d"]: r["step_ms"] for r in server_rows if r["servers"] == first}
            for r in server_rows:
                print(f"| {r['d']:,} | {r['servers']} | {r['workers']} | {r['MB_into_each_server']:.1f} | "
                      f"{r['step_ms']:.2f} | {r['decode_update_ms']:.2f} | {r['step_ms'] / base[r['d']]:.2f} |")
        print(json.dumps(rows + wire_rows + server_rows))


if __name__ == "__main__":
    main()
