"""When to speculate: pure functions choosing, per decode step, how many draft steps an EAGLE-3 round runs
(0 = a plain decode step, `choose_draft_steps`) and whether plain steps have won for good at a batch size
(`settled_on_plain`: the requests decoding then drop their drafts), and the `CostMeter` the stepper keeps
its timings in.

Why a choice at all: a round costs more device time than a plain step (draft steps, a verify over S + 1
tokens per request, the draft extend), and it pays off only while the tokens it emits per request outweigh
that cost. At batch 1 the step is bound by fixed per-step costs and a round is almost free; at large batches
the device is busy with the verify's extra tokens and a round can lose to plain decoding.

Small batches (fewer than `timed_from_batch_size` decoding requests) are decided from acceptance alone:
there a round costs about what a plain step costs (the step is bound by fixed per-step work), so it pays
whenever drafts are accepted at all; and a decision without timings gives the same steps to the same
requests on every run. The acceptance is the decoding requests' own (the stepper pools their rounds), and
a request that has run no round yet gets rounds: acceptance depends on the text, so one request's poor
drafts (say a server's warm-up prompt) must not turn rounds off for the next.

The model: drafts are accepted left to right, each with probability `accept_rate` given its parent was, so
a round with k draft steps emits `1 + a + a^2 + ... + a^k` tokens per request on average. The stepper
measures the seconds a decode step takes for each choice and batch-size bucket (`CostMeter`; steps that
compiled or finished requests are not samples: a finishing request's tree insert costs the same whichever
choice ran) and the acceptance from the rounds it ran; `choose_draft_steps` picks the choice with the
most tokens per second (a choice's cost counted as at least that of every choice with fewer draft steps,
`floored_seconds`), where an option other than the current one must win by a further
`switch_margin`: a switch costs what the step costs do not show (the overlap pipeline drains and refills,
the first step of a run is not a sample), and at a near tie the costs it compares, one of them fresh and
the other measured minutes earlier on a machine whose speed has moved since, would otherwise flip the
choice back and forth. A choice not measured yet, or not tried for `reprobe_after` steps, is tried
(exploration), so a change in acceptance or load is noticed. The stepper backs off a probe that lost: each
time a re-tried choice is dropped again after its minimum run, its interval doubles (up to
`MAX_REPROBE_AFTER`), and it goes back to `REPROBE_AFTER` once the choice wins a longer run. A server at a
steady load where rounds lose then pays for a few probe rounds per thousand steps, not per 64.
"""

from __future__ import annotations

import collections
import dataclasses
import statistics
from collections.abc import Mapping, Sequence

POLICIES = ("auto", "always", "never")
MIN_RUN = 3  # decode steps a choice keeps once chosen (the first of a run is not a steady-state sample)
REPROBE_AFTER = 64  # decode steps after which an option not tried is tried again (before any back-off)
MAX_REPROBE_AFTER = 1024
SWITCH_MARGIN = 0.05  # how much more tokens/s an option needs to replace the current one


@dataclasses.dataclass(frozen=True)
class StepCosts:
    """What the stepper measured for one batch-size bucket: `seconds[k]` the typical wall seconds of a
    decode step with k draft steps (`CostMeter`), `samples[k]` how many steps were measured,
    `since_tried[k]` decode steps since k last ran (absent: never); `last` the choice of the previous
    decode step and `run_length` how many decode steps in a row it has been chosen (a switch drains or
    refills the overlap pipeline, so only the steps after the first of a run measure the steady state);
    `reprobe_after[k]` the steps after which k is re-tried (absent: `choose_draft_steps`' `reprobe_after`;
    the stepper backs it off)."""

    seconds: Mapping[int, float] = dataclasses.field(default_factory=dict)
    samples: Mapping[int, int] = dataclasses.field(default_factory=dict)
    since_tried: Mapping[int, int] = dataclasses.field(default_factory=dict)
    last: int | None = None
    run_length: int = 0
    reprobe_after: Mapping[int, int] = dataclasses.field(default_factory=dict)


class CostMeter:
    """What a stepper measures for one batch-size bucket, as `choose_draft_steps` reads it (`view`): wall
    seconds of a decode step per choice, steps since each choice last ran, the current run, and each
    choice's re-probe interval: doubled (up to `MAX_REPROBE_AFTER`) each time a run of it ends within
    `MIN_RUN` steps (a probe that lost: the policy dropped it as soon as it could), back to
    `REPROBE_AFTER` after a longer run.

    A choice's seconds are the median of the last `WINDOW` samples of its latest run that gave any. The
    median: one step stalled by the OS or a garbage collection must not flip a choice that wins by 10-20%,
    as it could a mean. The latest run only: a probe's two samples replace what earlier runs measured.
    Blended into a window of older samples they would be outvoted, and a machine that slowed down during
    one run would keep the choice it made then for hundreds of steps."""

    WINDOW = 16

    def __init__(self) -> None:
        self.seconds: dict[int, float] = {}
        self._recent: dict[int, collections.deque[float]] = {}
        self.samples: dict[int, int] = {}
        self.since_tried: dict[int, int] = {}
        self.reprobe_after: dict[int, int] = {}
        self.last: int | None = None
        self.run_length = 0
        self._run_sampled = False  # whether the current run has given a sample yet

    def record(self, choice: int, seconds: float | None, *, chosen: bool = True) -> None:
        """A step with `choice` ran; `seconds` its wall time, None when it is not a steady-state sample.
        `chosen` False: the policy had no choice (say a request without a draft was decoding), and the
        step does not count towards re-trying the other options (they could not have run)."""
        new_run = self.last != choice
        if new_run:
            self._run_sampled = False
        if self.last is not None and new_run:  # a run of `last` ended
            base = REPROBE_AFTER
            lost_probe = self.run_length <= MIN_RUN  # dropped as soon as its minimum run was over
            interval = self.reprobe_after.get(self.last, base)
            self.reprobe_after[self.last] = min(2 * interval, MAX_REPROBE_AFTER) if lost_probe else base
        if chosen:
            for k in self.since_tried:
                self.since_tried[k] += 1
        self.since_tried[choice] = 0
        self.run_length = self.run_length + 1 if self.last == choice else 1
        self.last = choice
        if seconds is not None:
            recent = self._recent.setdefault(choice, collections.deque(maxlen=self.WINDOW))
            if not self._run_sampled:  # the run's first sample: what earlier runs measured is stale
                recent.clear()
                self._run_sampled = True
            recent.append(seconds)
            self.seconds[choice] = statistics.median(recent)
            self.samples[choice] = self.samples.get(choice, 0) + 1

    def view(self) -> StepCosts:
        return StepCosts(dict(self.seconds), dict(self.samples), dict(self.since_tried), self.last,
                         self.run_length, dict(self.reprobe_after))


def expected_tokens(num_draft_steps: int, accept_rate: float) -> float:
    """Tokens one request emits per step with `num_draft_steps` drafts: sum of accept_rate^i, i = 0..k."""
    return sum(accept_rate ** i for i in range(num_draft_steps + 1))


def choose_draft_steps(batch_size: int, *, options: Sequence[int], policy: str = "auto",
                       disable_batch_size: int | None = None, accept_rate: float | None = None,
                       fresh: bool = False, costs: StepCosts = StepCosts(), min_samples: int = 3,
                       reprobe_after: int = REPROBE_AFTER, min_run: int = MIN_RUN, margin: float = 0.05,
                       switch_margin: float = SWITCH_MARGIN, timed_from_batch_size: int = 4,
                       min_small_batch_tokens: float = 1.25) -> int:
    """The draft steps for the next decode step of `batch_size` requests, one of `options` (which holds 0
    and the configured num_steps, maybe more).

    `disable_batch_size`: at this many decoding requests or more, always 0 (a fixed override, any policy).
    `policy="always"`: otherwise the largest option; `policy="never"`: 0. `policy="auto"` below
    `timed_from_batch_size` requests: the largest option while it emits `min_small_batch_tokens` per
    request or more on average (or no round was measured, or `fresh`: a decoding request has run no round
    yet, or none ran for `reprobe_after` steps), else 0.
    `policy="auto"` from `timed_from_batch_size` requests on: the previous
    choice is kept until it ran `min_run` steps in a row (so that it gets measured in steady state); then
    an option with fewer
    than `min_samples` measurements, or not tried for its `costs.reprobe_after` steps (default
    `reprobe_after`), is tried (largest first);
    else the option with the most expected tokens per second, where a speculative option must beat plain
    decoding by `margin` (so noise does not flip a tie towards the costlier path) and an option other
    than `costs.last` must beat it by a further `switch_margin` (a switch has costs of its own). `accept_rate`
    None (no round measured yet) counts as 0."""
    if policy not in POLICIES:
        raise ValueError(f"speculative policy {policy!r}; choose one of {POLICIES}")
    if 0 not in options:
        raise ValueError(f"options {tuple(options)} must include 0 (plain decoding)")
    if disable_batch_size is not None and batch_size >= disable_batch_size:
        return 0
    largest = max(options)
    if policy == "always":
        return largest
    if policy == "never":
        return 0
    if batch_size < timed_from_batch_size:  # acceptance alone (module docstring), re-tried now and then
        if accept_rate is None or fresh or costs.since_tried.get(largest, reprobe_after) >= reprobe_after:
            return largest
        return largest if expected_tokens(largest, accept_rate) >= min_small_batch_tokens else 0
    if costs.last in options and costs.run_length < min_run:
        return costs.last
    for k in sorted(options, reverse=True):
        interval = costs.reprobe_after.get(k, reprobe_after)
        if costs.samples.get(k, 0) < min_samples or costs.since_tried.get(k, interval) >= interval:
            return k
    return _fastest(options, accept_rate, costs, margin, switch_margin)


def _fastest(options: Sequence[int], accept_rate: float | None, costs: StepCosts, margin: float,
             switch_margin: float) -> int:
    """The measured option with the most expected tokens per second, its cost floored by the cheaper
    options' (`floored_seconds`); speculation is handicapped by `margin`, and every option but the current
    one (`costs.last`, when it is an option) by `switch_margin`. Ties go to the fewest draft steps."""
    rate = accept_rate or 0.0
    current = costs.last if costs.last in options else None
    seconds = floored_seconds(options, costs.seconds)

    def tokens_per_s(k: int) -> float:
        gain = 1.0 if k == 0 else 1.0 / (1.0 + margin)
        if current is not None and k != current:
            gain /= 1.0 + switch_margin
        return gain * expected_tokens(k, rate) / seconds[k]

    return max(sorted(options), key=tokens_per_s)


def floored_seconds(options: Sequence[int], seconds: Mapping[int, float]) -> dict[int, float]:
    """The measured step seconds of `options`, each raised to the largest of the options with fewer draft
    steps: a round with k draft steps does all the work of one with fewer (a plain step is the target over
    one token per request; a round adds draft steps and verifies more tokens), so it never costs less. The
    measurements disagree with that only when they were taken at different machine speeds: the current
    choice's cost is fresh, the others' may be minutes old, and on a machine that slowed down since, a
    stale round could look cheaper than today's plain step and win with no draft ever accepted."""
    floored, floor = {}, 0.0
    for k in sorted(options):
        floor = max(floor, seconds[k])
        floored[k] = floor
    return floored


def settled_on_plain(batch_size: int, *, options: Sequence[int], policy: str = "auto",
                     accept_rate: float | None = None, costs: StepCosts = StepCosts(), min_samples: int = 3,
                     margin: float = 0.05, switch_margin: float = SWITCH_MARGIN,
                     timed_from_batch_size: int = 4) -> bool:
    """Whether `policy="auto"` has measured, at this batch size, that plain decoding beats every round: every
    option has `min_samples` measurements and plain decoding has the most expected tokens per second (the
    choice `choose_draft_steps` makes when it is not exploring). The stepper then drops the draft of the
    requests decoding now (`lazy_draft.DraftLag.detach`): keeping it usable costs a deferred draft extend
    per plain step, which only pays if a round comes back. Small batches (below `timed_from_batch_size`)
    are never settled: there rounds are decided from acceptance, and are re-tried."""
    if policy != "auto" or batch_size < timed_from_batch_size:
        return False
    if any(costs.samples.get(k, 0) < min_samples for k in options):
        return False
    return _fastest(options, accept_rate, costs, margin, switch_margin) == 0
