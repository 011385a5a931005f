"""A pbs follower's step (--servers K): rank 0's arrivals, answers and decode, carried out in
rank 0's order, so that this shard's table, steps and answers are rank 0's
(pgc_mpi.runtime.servers says why). The Master's methods for it, apart from its own loop."""

from __future__ import annotations

import functools
import logging
import time

from ..core.collector import Decoded
from ..core.message import Message
from ..errors import PgcError
from .control import DISPATCH_INTERVAL, WAIT_REMINDER
from .servers import ANSWER, ARRIVAL, DECODE

log = logging.getLogger("pgc_mpi")


class PbsFollowing:
    """Mixed into pgc_mpi.runtime.master.Master: the steps of a pbs follower (`follows_arrivals`)."""

    def _follow(self, t: int) -> tuple[Decoded | None, bool]:
        """A pbs follower's step t: rank 0's arrivals, answers and decode, carried out in rank 0's
        order (pgc_mpi.runtime.servers), so that this shard's table, steps and answers are rank 0's.
        Returns (decoded, False), or (None, False) once rank 0 ended the run."""
        self.collector.begin(t)
        self._begin(t)
        while (event := self.control.next_event(t)) is not None:
            kind, step, worker, value = event
            if kind == ARRIVAL:
                if not self._timed("receive", functools.partial(self._take, t, worker, step, bool(value))):
                    return None, False
            elif kind == ANSWER:
                if step != t:
                    raise PgcError(f"rank 0 answered worker {worker} with the model of step {step}, this server "
                                   f"is at step {t}: the servers' steps differ")
                self._timed("send", functools.partial(self.link.send_model, worker))
            elif kind == DECODE:
                dec = self._timed("decode", functools.partial(self.collector.decode, partial=True))
                self.control.report(*self.diagnostics.report(t, self.collector.table, self.opt.grad,
                                                              value if value >= 0 else None))
                return dec, False
        return None, False

    def _take(self, t: int, worker: int, step: int, offered: bool) -> bool:
        """A pbs follower: do with `worker`'s next message what rank 0 did with it (offer it to the
        table, or drop it), waiting for it if it has not come; False once rank 0 ended the run."""
        arrived, malformed = self._await(t, worker)
        if not arrived:
            return False
        if not offered:  # rank 0 refused it before its table: so does this server
            if malformed is None:
                self.link.post(worker)
            self.totals.rejected_messages += 1
            return True
        why = malformed
        if why is None:
            msg, values = Message.read(self.link.headers[worker]), self.link.gradient(worker)
            why = self._fault(worker, msg, values)[1] or (f"its step is {msg.step}, rank 0's copy's {step}"
                                                          if msg.step != step else None)
        if why is not None:
            raise PgcError(f"step {t}: rank 0 took worker {worker}'s message into the pbs table, but its part here "
                           f"is unusable ({why}): the servers' tables would differ")
        self.collector.offer(msg, values)
        self.link.post(worker)
        return True

    def _await(self, t: int, worker: int) -> tuple[bool, str | None]:
        """Wait for `worker`'s next message: (True, None) once it is in its buffer, (True, reason)
        when it was malformed (the transport has dropped it), (False, None) when rank 0 ended the
        run first."""
        began = time.monotonic()
        reminder = began + WAIT_REMINDER
        while worker not in self._unnamed:
            bad = next((i for i, (w, _) in enumerate(self.link.malformed) if w == worker), None)
            if bad is not None:
                return True, self.link.malformed.pop(bad)[1]
            if self.control.stop_signal(t):
                return False, None
            self._unnamed.update(self.link.poll(time.monotonic() + DISPATCH_INTERVAL))
            if time.monotonic() >= reminder:
                log.warning("step %d: waited %.0f s so far for worker %d's message, which rank 0 has received",
                            t, time.monotonic() - began, worker)
                reminder += WAIT_REMINDER
        self._unnamed.discard(worker)
        return True, None
