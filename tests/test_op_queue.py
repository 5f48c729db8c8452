"""The op queue on its own (no ranks): one op at a time in submission order, whoever runs
it; a waited-for op runs on the waiting thread; an op that is not waited for is started
by the worker when its future is asked for, its completion polled, or an op queued behind
it, and otherwise within the unclaimed-start poll; a failure stops every later op."""

from __future__ import annotations

import random
import threading
import time

import pytest

from ccddp.backend.queue import UNCLAIMED_START_S, OpQueue

pytestmark = pytest.mark.unit


@pytest.fixture
def queue():
    q = OpQueue("test-queue")
    yield q
    q.close()


def _recorder(log: list, name: str, gate: threading.Event | None = None):
    def job() -> None:
        if gate is not None:
            assert gate.wait(10)
        log.append(name)
    return job


def test_a_waited_op_runs_on_the_waiting_thread(queue):
    log = []
    t = queue.submit(_recorder(log, "a"), result=["a"])
    assert queue.wait(t)
    assert log == ["a"] and t.thread == threading.current_thread().name
    assert t.latch is None  # nobody blocked on it: no lock was made
    assert queue.future(t).wait() == ["a"]  # asked for afterwards: already complete


def test_asking_for_the_future_starts_the_op_on_the_worker(queue):
    log = []
    t = queue.submit(_recorder(log, "a"), result=[1])
    fut = queue.future(t)
    assert fut.wait() == [1]
    assert log == ["a"] and t.thread == "test-queue"


def test_an_op_nobody_claims_is_started_by_the_poll(queue):
    log = []
    t = queue.submit(_recorder(log, "a"), result=None)
    # Nothing asks for it: the worker's idle poll starts it.
    deadline = time.monotonic() + UNCLAIMED_START_S * 40
    while not t.finished and time.monotonic() < deadline:
        time.sleep(UNCLAIMED_START_S / 10)
    assert t.finished
    assert log == ["a"] and t.thread == "test-queue"


def test_an_op_queued_behind_starts_the_one_in_front(queue):
    log, gate = [], threading.Event()
    first = queue.submit(_recorder(log, "first", gate), result=None)
    second = queue.submit(_recorder(log, "second"), result=None)
    gate.set()
    assert queue.wait(second)
    assert log == ["first", "second"]
    assert first.thread == "test-queue"


def test_waiting_on_a_later_op_keeps_the_order(queue):
    log, gate = [], threading.Event()
    ts = [queue.submit(_recorder(log, i, gate if i == 0 else None), result=None) for i in range(5)]
    threading.Timer(0.2, gate.set).start()
    assert queue.wait(ts[3])
    assert log[:4] == [0, 1, 2, 3]
    assert queue.wait(ts[4]) and log == [0, 1, 2, 3, 4]


def test_a_timeout_wait_returns_false_and_the_op_still_runs(queue):
    gate = threading.Event()
    t = queue.submit(_recorder([], "slow", gate), result=None)
    assert queue.wait(t, timeout_s=0.05) is False
    gate.set()
    assert queue.wait(t, timeout_s=10)


def test_a_failure_fails_every_later_op(queue):
    def boom() -> None:
        raise ValueError("link broke")

    bad = queue.submit(boom, result=None)
    later = queue.submit(lambda: None, result=None)
    fut = queue.future(later)
    with pytest.raises(ValueError, match="link broke"):
        queue.wait(bad)
    with pytest.raises(ValueError, match="link broke"):
        fut.wait()
    assert queue.failure is not None


def test_a_callback_may_wait_on_a_later_op(queue):
    # PowerSGD's hook: a future's callback issues another op of the group and waits on it.
    log = []
    first = queue.submit(_recorder(log, "first"), result=None)

    def then(_):
        inner = queue.submit(_recorder(log, "inner"), result=None)
        queue.wait(inner)
        return "chained"

    assert queue.future(first).then(then).wait() == "chained"
    assert log == ["first", "inner"]


def test_threads_submitting_and_waiting_at_once_run_each_op_once_in_order(queue):
    ran, submitted = [], []
    lock = threading.Lock()
    rng = random.Random(7)

    def client(k: int) -> None:
        for i in range(40):
            with lock:  # submission order = the order the queue saw
                t = queue.submit(lambda tag=(k, i): ran.append(tag), result=None)
                submitted.append((k, i))
            how = rng.random()
            if how < 0.4:
                queue.wait(t)
            elif how < 0.7:
                queue.future(t).wait()
            elif how < 0.8:
                time.sleep(0.001)
                queue.wait(t, timeout_s=10)
            # else: never waited for; the poll or a later op starts it

    threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    last = queue.submit(lambda: None, result=None)
    assert queue.wait(last)
    assert ran == submitted
