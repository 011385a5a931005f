"""The transport under real MPI (pytest-mpi): run with `mpiexec -n N python -m pytest --with-mpi -m mpi`.

Written for any N >= 2: rank 0 is the master, every other rank a worker.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from pgc_mpi.core.message import Layout, Message, gradient_header
from pgc_mpi.runtime.transport import MasterTransport, WorkerTransport, duplicate_world


def _layout(dim: int = 1000) -> Layout:
    return Layout(gradient_header(2), dim=dim, dtype=np.float32)


def _master_sending(comm, n: int, step: int, w: np.ndarray) -> MasterTransport:
    """Rank 0's link with every gradient receive posted and the model `w` of `step` sent to every worker."""
    link = MasterTransport(comm, n, _layout(len(w)), poll_interval=0.001)
    for i in range(n):
        link.post(i)
    link.publish(step, w)
    for i in range(n):
        link.send_model(i)
    return link


def _master_collect(link: MasterTransport, n: int, timeout: float = 30.0) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    got = {}
    until = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < until:
        for i in link.poll(until):
            got[i] = (link.headers[i].copy(), link.payloads[i].copy())
    return got


def _worker(comm, dim: int = 1000) -> WorkerTransport:
    """A worker rank's link (every rank but 0), for models of `dim` parameters."""
    return WorkerTransport(comm, _layout(dim), poll_interval=0.001)


def _worker_takes_the_stop(link: WorkerTransport) -> None:
    """What a worker receives next is the master's stop, not a model; it confirms the stop."""
    assert link.next_model() is None and link.stopped
    link.confirm_stop()


def _worker_answers_and_stops(link: WorkerTransport) -> None:
    """A worker's last answer: its gradient (the link's buffers as they are), then the stop."""
    link.send()
    _worker_takes_the_stop(link)


@pytest.mark.mpi(min_size=2)
def test_models_out_coded_gradients_in_and_a_clean_stop():
    comm = duplicate_world()
    n = comm.Get_size() - 1
    w = np.linspace(0, 1, 1000, dtype=np.float32)
    if comm.Get_rank() == 0:
        link = _master_sending(comm, n, 3, w)
        sent = w.copy()
        w += 5.0  # the master may update right away: the workers got the published snapshot
        got = _master_collect(link, n)
        assert sorted(got) == list(range(n))
        for i, (header, payload) in got.items():
            msg = Message.read(header)
            assert (msg.step, msg.worker, msg.versions, msg.loss) == (3, i, (2, 3), 0.5)
            np.testing.assert_array_equal(payload, sent * (i + 1))
        assert link.bytes_received == n * _layout().nbytes
        assert link.shutdown(grace=20) == []
    else:
        link = _worker(comm)
        assert link.next_model() == 3
        np.testing.assert_array_equal(link.model, w)
        link.payloads[0][:] = link.model * comm.Get_rank()
        link.write_header(Message(3, comm.Get_rank() - 1, (2, 3), loss=0.5))
        _worker_answers_and_stops(link)
    comm.Free()


@pytest.mark.mpi(min_size=2)
def test_a_worker_that_fell_behind_keeps_only_the_newest_model():
    comm = duplicate_world()
    n = comm.Get_size() - 1
    if comm.Get_rank() == 0:
        link = MasterTransport(comm, n, _layout(), poll_interval=0.001)
        for i in range(n):
            link.post(i)
        for step in (1, 2, 3):
            link.publish(step, np.full(1000, step, dtype=np.float32))
            for i in range(n):
                link.send_model(i)
        got = _master_collect(link, n)
        assert all(header["step"] == 3 for header, _ in got.values())
        assert link.shutdown(grace=20) == []
    else:
        link = _worker(comm)
        time.sleep(0.3)  # busy elsewhere while three models arrive
        seen = [link.next_model()]
        until = time.monotonic() + 10
        while seen[-1] != 3 and time.monotonic() < until:
            newer = link.next_model(block=False)
            if newer is not None:
                seen.append(newer)
        assert seen == sorted(seen) and seen[-1] == 3  # never an older model after a newer one
        assert (link.model == 3).all()
        link.headers[0]["step"] = 3
        _worker_answers_and_stops(link)
    comm.Free()


@pytest.mark.mpi(min_size=2)
def test_a_late_gradient_sent_while_stopping_is_received_not_left_pending():
    comm = duplicate_world()
    n = comm.Get_size() - 1
    if comm.Get_rank() == 0:
        link = _master_sending(comm, n, 0, np.zeros(2_000_000, dtype=np.float32))
        assert link.shutdown(grace=30) == []  # stop before any gradient came back
    else:
        link = _worker(comm, 2_000_000)
        assert link.next_model() == 0
        time.sleep(0.2)
        _worker_answers_and_stops(link)  # 8 MB: a rendezvous send that needs the master's receive to still be posted
    comm.Free()


@pytest.mark.mpi(min_size=3)
def test_a_worker_silent_for_longer_than_the_grace_is_abandoned_without_a_stop():
    """A node gone from the network looks like a silent worker; a message to it can crash MPICH."""
    comm = duplicate_world()
    n = comm.Get_size() - 1
    silent = n - 1
    if comm.Get_rank() == 0:
        link = _master_sending(comm, n, 0, np.zeros(1000, dtype=np.float32))
        until = time.monotonic() + 1.5  # the others answer every model; the silent one never does
        while time.monotonic() < until:
            for i in link.poll(until):
                link.post(i)
                link.send_model(i)
        assert link.shutdown(grace=1.0) == [silent]
        comm.Ibarrier().Wait()  # (a blocking barrier never matches a non-blocking one)
    else:
        link = _worker(comm)
        if comm.Get_rank() - 1 == silent:
            assert link.next_model() == 0
            done = comm.Ibarrier()
            while not done.Test():
                assert not link.stop_requested()
                time.sleep(0.01)
            time.sleep(0.3)  # a stop sent just before the barrier would have landed by now
            assert not link.stop_requested()
        else:
            while link.next_model() is not None:
                link.send()
            link.confirm_stop()
            comm.Ibarrier().Wait()
    comm.Free()


@pytest.mark.mpi(min_size=2)
def test_a_model_followed_by_the_stop_is_returned_before_the_stop():
    """The stop never swallows the model sent before it (it once did, when both were waiting)."""
    comm = duplicate_world()
    n = comm.Get_size() - 1
    if comm.Get_rank() == 0:
        link = _master_sending(comm, n, 7, np.ones(1000, dtype=np.float32))
        assert link.shutdown(grace=20) == []  # a small model is sent eagerly: the stop follows at once
    else:
        link = _worker(comm)
        time.sleep(0.3)  # both are waiting by now
        assert link.next_model() == 7 and not link.stopped
        assert (link.model == 1).all()
        _worker_takes_the_stop(link)
    comm.Free()
