"""Async pipelining: a Gantt chart of rollout, train and sync, for three topologies.

    colocated       one set of devices does everything in turn: sample, train, sync
                    (sync is cheap: the engine reads the trainer's weights in place)
    sync            rollout devices and trainer devices apart (disaggregated), in lockstep: each side idles
                    while the other works (step = rollout + train + sync)
    async k         the rollout side samples batch s+1..s+k while the trainer trains on s:
                    step → max(rollout, train + sync), at the price of staleness: batch s
                    was sampled by weights up to k updates old

Staleness buys throughput only until the slower lane is always busy: past that "freshness
wall" a larger k adds staleness and nothing else. With steady times k = 1 reaches it; with
rollout times that vary (long tails) a larger k smooths the variation away.

`simulate` runs the schedule step by step and returns every bar; `render` draws it in text.

Weight sync has four operations (`weight_sync`): all-gather the trainer's shards into full
tensors, cast to the engine's dtype, broadcast to the rollout devices, reshard into the
engine's tensor-parallel layout.
"""

from __future__ import annotations

from dataclasses import dataclass

TOPOLOGIES = ("colocated", "sync", "async")  # the names of --dist.topology


@dataclass(frozen=True)
class Bar:
    lane: str  # "rollout", "train", "sync"
    step: int
    start: float
    end: float
    weight_version: int  # rollout bars: the weights that sampled this batch; train/sync: the version they produce


@dataclass(frozen=True)
class Gantt:
    topology: str
    bars: list[Bar]
    staleness: list[int]  # per step: updates between the sampling weights and the trained ones

    @property
    def makespan(self) -> float:
        return max(b.end for b in self.bars)

    def step_ends(self) -> list[float]:
        return [b.end for b in self.bars if b.lane == "sync"]

    def steady_step_seconds(self) -> float:
        """Time between the ends of the last two steps (the first steps fill the pipeline)."""
        ends = self.step_ends()
        return ends[-1] - ends[-2] if len(ends) > 1 else ends[0]

    def busy_fraction(self, lane: str) -> float:
        """How much of the makespan `lane` is working; 1 − this is its idle time."""
        return sum(b.end - b.start for b in self.bars if b.lane == lane) / self.makespan


def simulate(topology: str, rollout_seconds: list[float], train_seconds: list[float], sync_seconds: float,
             max_staleness: int = 1) -> Gantt:
    """The schedule of len(rollout_seconds) steps. Step s samples batch s (rollout_seconds[s]),
    trains on it (train_seconds[s]) and publishes weight version s + 1 (sync_seconds).

    colocated: one lane does all three in turn. sync: rollout s starts when
    version s is out. async: rollout s starts when the rollout lane is free and version
    s − max_staleness is out, and samples with the newest version then available."""
    if topology not in TOPOLOGIES:
        raise ValueError(f"topology={topology!r}: expected one of {TOPOLOGIES}")
    if len(rollout_seconds) != len(train_seconds) or not rollout_seconds:
        raise ValueError(f"{len(rollout_seconds)} rollout and {len(train_seconds)} train times: give one of each "
                         "per step, at least one step")
    if topology == "async" and max_staleness < 1:
        raise ValueError(f"max_staleness={max_staleness}: async samples ahead by at least 1 (0 is the sync topology)")
    k = max_staleness if topology == "async" else 0
    published = [0.0]  # published[v]: when weight version v became available (version 0 at the start)
    bars: list[Bar] = []
    staleness = []
    rollout_free = train_free = 0.0
    for s, (t_roll, t_train) in enumerate(zip(rollout_seconds, train_seconds)):
        if topology == "colocated":
            start = max(train_free, published[s])
        else:
            start = max(rollout_free, published[max(0, s - k)])
        version = max(v for v, t in enumerate(published) if t <= start)
        rollout_free = start + t_roll
        bars.append(Bar("rollout", s, start, rollout_free, version))
        train_start = max(rollout_free, train_free)
        train_end = train_start + t_train
        bars.append(Bar("train", s, train_start, train_end, s + 1))
        train_free = train_end + sync_seconds  # the trainer sends the weights before its next update
        bars.append(Bar("sync", s, train_end, train_free, s + 1))
        published.append(train_free)
        staleness.append(s - version)
    return Gantt(topology, bars, staleness)


def freshness_wall(rollout_seconds: list[float], train_seconds: list[float], sync_seconds: float,
                   ks: range = range(0, 5)) -> list[tuple[int, float, float]]:
    """(k, mean seconds per step, mean staleness) for each max_staleness k (0 = sync):
    where the step time stops falling while staleness keeps rising is the wall."""
    out = []
    for k in ks:
        g = simulate("async" if k else "sync", rollout_seconds, train_seconds, sync_seconds, k or 1)
        out.append((k, g.makespan / len(rollout_seconds), sum(g.staleness) / len(g.staleness)))
    return out


def render(gantt: Gantt, width: int = 72) -> str:
    """The chart in text, one row per lane: the step's last digit where that lane works."""
    scale = width / gantt.makespan
    lines = []
    for lane in ("rollout", "train", "sync"):
        row = [" "] * width
        for bar in (b for b in gantt.bars if b.lane == lane):
            first, last = int(bar.start * scale), max(int(bar.start * scale) + 1, int(bar.end * scale))
            for i in range(first, min(last, width)):
                row[i] = str(bar.step % 10)
        lines.append(f"{lane:>8} |{''.join(row)}|")
    lines.append(f"{'':>8}  0{'':{width - 12}}{gantt.makespan:>9.1f} s")
    return "\n".join(lines)


@dataclass(frozen=True)
class WeightSync:
    """The four operations of one weight sync, in seconds."""

    all_gather: float  # the trainer's ZeRO-3 / FSDP shards into full tensors
    cast: float  # fp32 master → the engine's dtype
    broadcast: float  # to the rollout devices
    reshard: float  # into the engine's tensor-parallel layout

    @property
    def total(self) -> float:
        return self.all_gather + self.cast + self.broadcast + self.reshard


def weight_sync(parameters: float, *, train_gpus: int, link_bytes_per_second: float, memory_bytes_per_second: float,
                master_bytes: float = 4, engine_bytes: float = 2, colocated: bool = False,
                engine_tensor_parallel: int = 1, latency_seconds: float = 0.0) -> WeightSync:
    """Cost of one sync by an alpha-beta model (latency + bytes / bandwidth):

    all-gather   ring: each GPU receives (n − 1)/n of the weights, at `master_bytes` each
    cast         read master_bytes and write engine_bytes per parameter, at memory bandwidth
    broadcast    a pipelined broadcast moves the engine-dtype weights once over the link,
                 whatever the number of receivers; colocated engines read them in place
                 (CUDA IPC, or our shared module): 0
    reshard      each engine GPU copies its 1/tp slice into place: read + write at memory bandwidth
    """
    n = train_gpus
    weights = parameters * master_bytes
    gather = latency_seconds + (n - 1) / n * weights / link_bytes_per_second if n > 1 else 0.0
    cast = 0.0 if master_bytes == engine_bytes else parameters * (master_bytes + engine_bytes) / memory_bytes_per_second
    broadcast = 0.0 if colocated else latency_seconds + parameters * engine_bytes / link_bytes_per_second
    reshard = 2 * parameters * engine_bytes / engine_tensor_parallel / memory_bytes_per_second
    return WeightSync(gather, cast, broadcast, reshard)


def pipeline_bubble(stages: int, micro_batches: int) -> float:
    """The idle fraction of a pipeline-parallel pass (GPipe, Huang et al. 2019,
    https://arxiv.org/abs/1811.06965): p stages and m micro-batches take m + p − 1 slots, in
    each of which a stage works on at most one micro-batch, so each stage idles p − 1 of them:

        bubble = (p − 1) / (m + p − 1)

    RL meets it twice: the update wants many micro-batches (m ≫ p), and a pipelined rollout
    engine decodes one token per row per pass, so once only the long tail's rows are left
    (a single micro-batch of stragglers, m = 1) each pass idles (p − 1)/p of the GPUs."""
    if stages < 1 or micro_batches < 1:
        raise ValueError(f"stages={stages}, micro_batches={micro_batches}: both at least 1")
    return (stages - 1) / (micro_batches + stages - 1)
