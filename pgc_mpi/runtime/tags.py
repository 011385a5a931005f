"""Every MPI tag of the runtime, in one table: each message kind on the one communicator has a tag
of its own, and no two kinds share one (tests/runtime/test_tags.py checks it). A module that sends
or receives a kind imports its tag from here; a new kind of message gets a new number here."""

from __future__ import annotations

# the gradient transport (pgc_mpi.runtime.transport)
TAG_MODEL = 101  # a server's model (parameters and step) to a worker
TAG_GRAD = 102  # a worker's coded gradient message to a server
TAG_STOP = 103  # a server's stop to a worker (never followed by a model)
TAG_BYE = 104  # a worker's goodbye to a server after the stop

# the ddp baseline's links to the watching rank 0 (pgc_mpi.runtime.links: PeerReporter, PeerInbox)
TAG_REPORT = 105  # a ddp worker's step report to rank 0
TAG_PARAMS = 106  # ddp rank 1's parameters to rank 0 (evaluation, checkpoints)
TAG_VERDICT = 107  # rank 0's verdict (go on or stop) back to the ddp workers

# --servers K: rank 0 and the other servers (pgc_mpi.runtime.links: LeaderLink, FollowerLink)
TAG_ORDER = 108  # rank 0's order to the other servers for a step
TAG_SHARD = 109  # a follower's shard of the parameters to rank 0
TAG_STATE = 110  # a follower's optimizer state to rank 0
TAG_START = 111  # what a follower starts from, sent by rank 0
TAG_SERVER_REPORT = 112  # a follower's report to rank 0 at the end
TAG_DIAGNOSIS = 113  # pbs: a follower's step diagnostics (partial sums, shards of two models at a probe)
TAG_TABLE = 114  # pbs: a follower's shard of the partition table

# the workers' signs of life (pgc_mpi.runtime.heartbeat)
TAG_ALIVE = 115  # a worker's heartbeat to rank 0

# --abandon-late (pgc_mpi.runtime.abandon)
TAG_DECIDED = 116  # a server's notice to a worker: the step its job was for is decided
TAG_ABANDONED = 117  # a worker's answer: the step it dropped

# --drop-compute auto (pgc_mpi.runtime.drop_threshold)
TAG_THRESHOLD = 118  # rank 0's drop threshold to the workers

TAGS: dict[str, int] = {name: value for name, value in globals().items() if name.startswith("TAG_")}
"""Every tag by name (the uniqueness test reads it)."""
