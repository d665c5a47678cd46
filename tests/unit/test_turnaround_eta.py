"""The ETA walk over the queue order."""

from __future__ import annotations

import pytest

from radserve.turnaround.eta import (
    Arrivals,
    Capacity,
    Entry,
    latency_lane,
    overtaking_delay,
    walk,
)
from radserve.turnaround.service_time import JobEstimate

EST = JobEstimate(cpu_s=6.0, device_s=4.0, latency_s=10.0, spread_s=0.0, source="fitted")


def _entry(
    i: int,
    cls: int = 2,
    *,
    running: bool = False,
    started: float | None = None,
    deadline: float = 1000.0,
) -> Entry:
    return Entry(f"j{i}", cls, running, deadline=deadline, started=started, estimate=EST)


def test_single_job_takes_its_latency() -> None:
    (eta,) = walk([_entry(0)], 100.0, Capacity())
    assert (eta.start, eta.finish, eta.finish_late) == (100.0, 110.0, 110.0)


def test_a_long_queue_is_bound_by_its_bottleneck_resource() -> None:
    # one device, 4 device-seconds per job: one job every 4 s once the queue is long
    jobs = [_entry(i) for i in range(100)]
    etas = walk(jobs, 0.0, Capacity(cpu_workers=2, devices=1, max_running=4))
    assert [e.position for e in etas] == list(range(100))
    assert etas[-1].finish == 400.0
    # two devices: the CPU pool (2 workers, 6 CPU-seconds per job) is then the bound
    two = walk(jobs, 0.0, Capacity(cpu_workers=2, devices=2, max_running=4))
    assert two[-1].finish == 300.0
    finishes = [e.finish for e in etas]
    assert finishes == sorted(finishes)
    # the 5th routine job waits for a slot: the first to free
    assert etas[4].start == etas[0].finish


def test_running_jobs_hold_their_slots_and_their_remaining_work() -> None:
    running = [_entry(i, running=True, started=95.0) for i in range(4)]
    etas = walk([*running, _entry(9)], 100.0, Capacity(max_running=4))
    assert all(e.start == 95.0 for e in etas[:4])
    assert etas[0].finish == 105.0  # 10 s latency, 5 s run
    assert etas[4].start >= 105.0  # a slot frees when a running job ends


def test_urgent_exclusive_holds_routine_starts_behind_urgent_work() -> None:
    etas = walk([_entry(0, cls=0), _entry(1, cls=2)], 0.0, Capacity(urgent_exclusive=True))
    assert etas[1].start == etas[0].finish == 10.0
    shared = walk([_entry(0, cls=0), _entry(1, cls=2)], 0.0, Capacity(urgent_exclusive=False))
    assert shared[1].start == 0.0


def test_later_urgent_arrivals_widen_only_routine_bands() -> None:
    capacity = Capacity(arrivals=(Arrivals(0, 1 / 60, EST),))
    etas = walk([_entry(0, cls=0), *[_entry(i) for i in range(1, 40)]], 0.0, capacity)
    assert etas[0].finish_late == etas[0].finish  # URGENT is not overtaken by URGENT
    bands = [e.finish_late - e.finish for e in etas[1:]]
    assert all(b > 0 for b in bands)
    assert bands[-1] > bands[0]  # a longer horizon, more URGENT arrivals in it


def test_bench_eta_cost_walks_every_queued_job() -> None:
    from radserve.bench.eta import eta_cost

    row = eta_cost(50, repeats=2)  # it asserts one ETA per queued job; no time asserted
    assert row["jobs"] == 50 and row["repeats"] == 2


def test_a_cpu_device_shares_the_host_cores_with_the_cpu_pool() -> None:
    """On a CPU device a batch uses every core: device and CPU-pool work take turns, so a
    long queue drains at their sum per job, not at the larger of the two."""
    from radserve.turnaround.eta import on_host_cores

    jobs = [_entry(i) for i in range(100)]
    separate = walk(jobs, 0.0, Capacity(cpu_workers=2, devices=1, max_running=4))
    shared = walk(jobs, 0.0, Capacity(cpu_workers=2, devices=1, max_running=4, host_cores=2))
    assert separate[-1].finish == 400.0  # max(600 / 2, 400 / 1)
    assert shared[-1].finish == 700.0  # 600 / 2 + 400 / 1
    assert shared[0].finish == separate[0].finish == 10.0  # one job: its own latency
    assert on_host_cores("cpu") and on_host_cores("openvino")
    assert not on_host_cores("cuda:0")


def test_routine_finish_expects_the_mean_of_later_urgent_arrivals() -> None:
    """A routine job's finish adds the URGENT work expected within its horizon (Poisson
    mean), the band's end the 90th percentile; URGENT jobs are not delayed by them."""
    jobs = [_entry(0, cls=0), *[_entry(i) for i in range(1, 20)]]
    quiet = walk(jobs, 0.0, Capacity())
    busy = walk(jobs, 0.0, Capacity(arrivals=(Arrivals(0, 1 / 100, EST),)))
    assert busy[0].finish == quiet[0].finish  # URGENT
    for q, b in zip(quiet[1:], busy[1:], strict=True):
        horizon = q.finish
        # one fixed-point step: arrivals over the horizon, then over horizon + their work
        first = horizon / 100 * EST.latency_s
        assert b.finish == pytest.approx(q.finish + (horizon + first) / 100 * EST.latency_s)
        assert q.finish < b.finish <= b.finish_late


TATS = (300.0, 300.0, 1800.0)  # URGENT, INPATIENT, OUTPATIENT (as configured by default)


def test_a_job_that_starts_at_once_gets_the_allowance_on_its_throughput_bound_only() -> None:
    """Its learned run time already holds what overtaking arrivals did to jobs of its
    kind (session 32): the allowance goes on the throughput bound, and the later of that
    and its own chain is its finish; a job waiting for a slot still has it added, and
    ``always`` (before) adds it to both."""
    arrivals = (Arrivals(0, 1 / 100, EST),)
    jobs = [_entry(i, cls=2, deadline=5000.0) for i in range(6)]  # 4 slots: 2 wait
    quiet = walk(jobs, 0.0, Capacity(tat_s=TATS))
    waiting = walk(jobs, 0.0, Capacity(arrivals=arrivals, tat_s=TATS))
    always = walk(jobs, 0.0, Capacity(arrivals=arrivals, tat_s=TATS, chain_allowance="always"))
    for position in range(4):  # start at once: chain 10 s, throughput 8 s .. 20 s
        q, w, a = quiet[position], waiting[position], always[position]
        own = EST.latency_s
        throughput = max(6.0 * (position + 1) / 2, 4.0 * (position + 1))
        mean = a.finish - q.finish  # the allowance, as "always" adds it
        assert q.finish == max(own, throughput)
        assert w.finish == pytest.approx(max(own, throughput + mean))
        assert w.finish <= a.finish
    assert waiting[0].finish == EST.latency_s  # the chain dominates: no allowance at all
    assert waiting[3].finish > quiet[3].finish  # the throughput bound dominates: added
    for position in (4, 5):  # wait for a slot: added as before
        assert waiting[position].finish == pytest.approx(always[position].finish)
        assert waiting[position].finish > quiet[position].finish


def test_every_class_ranked_ahead_overtakes_and_nothing_else_does() -> None:
    """INPATIENT arrivals delay OUTPATIENT work as URGENT ones delay both; an INPATIENT
    job is not delayed by INPATIENT (EDF: later arrivals have later deadlines) nor by
    OUTPATIENT arrivals."""
    # the allowance added to every job, whether its chain starts at once or not
    options = {"tat_s": TATS, "chain_allowance": "always"}
    inpatient_only = Capacity(arrivals=(Arrivals(1, 1 / 100, EST),), **options)
    both = Capacity(arrivals=(Arrivals(0, 1 / 100, EST), Arrivals(1, 1 / 100, EST)), **options)
    jobs = [_entry(0, cls=1, deadline=5000.0), _entry(1, cls=2, deadline=5000.0)]
    quiet = walk(jobs, 0.0, Capacity(tat_s=TATS))
    inp = walk(jobs, 0.0, inpatient_only)
    two = walk(jobs, 0.0, both)
    assert inp[0].finish == quiet[0].finish  # INPATIENT is not overtaken by INPATIENT
    assert inp[1].finish > quiet[1].finish  # OUTPATIENT is
    assert two[0].finish > quiet[0].finish  # URGENT overtakes INPATIENT
    assert two[1].finish > inp[1].finish  # and OUTPATIENT, on top of INPATIENT arrivals
    # INPATIENT arrivals do not stop other starts: each costs its share of throughput,
    # not its latency (an URGENT one, under urgent_exclusive, costs its latency)
    assert inpatient_only.hold_s(1, EST) == 4.0  # max(cpu 6 / 2 workers, device 4 / 1)
    assert inpatient_only.hold_s(0, EST) == EST.latency_s


def test_aging_ends_the_overtaking_window_of_lower_classes() -> None:
    """An OUTPATIENT job is aged to INPATIENT once its slack is under 25 % of its TAT;
    from then on INPATIENT arrivals overtake it only while their deadline (arrival + 300
    s) comes before its own; URGENT arrivals overtake it throughout."""
    capacity = Capacity(arrivals=(Arrivals(1, 1 / 10, EST),), tat_s=TATS)
    hold = capacity.hold_s(1, EST)
    far = _entry(0, cls=2, deadline=10_000.0)  # ages at 10,000 - 450: beyond the horizon
    near = _entry(1, cls=2, deadline=400.0)  # aged already; EDF lets arrivals by until 100
    gone = _entry(2, cls=2, deadline=250.0)  # aged; an arrival now is due after it
    mean_far, _ = overtaking_delay(far, 50.0, 0.0, capacity)
    assert mean_far == pytest.approx(0.1 * (50.0 + 0.1 * 50.0 * hold) * hold)
    assert overtaking_delay(near, 1000.0, 0.0, capacity)[0] == pytest.approx(0.1 * 100 * hold)
    assert overtaking_delay(gone, 1000.0, 0.0, capacity) == (0.0, 0.0)
    urgent = Capacity(arrivals=(Arrivals(0, 1 / 10, EST),), tat_s=TATS)
    assert overtaking_delay(gone, 100.0, 0.0, urgent)[0] > 0


def test_the_band_end_is_the_90th_percentile_of_the_overtaking_work() -> None:
    capacity = Capacity(arrivals=(Arrivals(0, 1 / 50, EST), Arrivals(1, 1 / 50, EST)), tat_s=TATS)
    mean, high = overtaking_delay(_entry(0, cls=2, deadline=1e6), 100.0, 0.0, capacity)
    assert 0 < mean < high


def test_the_allowance_under_the_rates_posterior() -> None:
    """An URGENT rate r counted from ``shape`` arrivals, a horizon W, a hold h: at the
    point rate the two steps are r W h + r^2 W h^2; the posterior mean adds the rate's
    own variance, r^2 W h^2 / shape (E[r^2] = r^2 (1 + 1 / shape)); the posterior's
    median is below the point mean, more so the fewer arrivals; a point rate (no shape)
    is as before under either rule."""
    entry, r, w, h = _entry(0, cls=2, deadline=1e6), 1 / 20, 100.0, EST.latency_s

    def capacity(rule: str, shape: float | None) -> Capacity:
        return Capacity(arrivals=(Arrivals(0, r, EST, shape),), tat_s=TATS, rate_posterior=rule)

    point, point_high = overtaking_delay(entry, w, 0.0, capacity("point", 2.0))
    assert point == pytest.approx(r * w * h + r * r * w * h * h)
    mean, mean_high = overtaking_delay(entry, w, 0.0, capacity("mean", 2.0))
    assert mean == pytest.approx(point + r * r * w * h * h / 2.0)
    assert mean_high > point_high  # the band widens by the rate's own spread
    unsure, _ = overtaking_delay(entry, w, 0.0, capacity("posterior", 1.0))
    surer, _ = overtaking_delay(entry, w, 0.0, capacity("posterior", 50.0))
    assert unsure < surer < point
    assert overtaking_delay(entry, w, 0.0, capacity("mean", None)) == (point, point_high)


def test_latency_lanes_name_a_jobs_class_or_whether_it_runs_alone() -> None:
    assert [latency_lane(c, "none") for c in (0, 1, 2)] == [None, None, None]
    assert [latency_lane(c, "class") for c in (0, 1, 2)] == ["urgent", "inpatient", "outpatient"]
    assert [latency_lane(c, "exclusive") for c in (0, 1, 2)] == ["alone", "shared", "shared"]
    # without urgent_exclusive an URGENT job shares the cores too
    assert latency_lane(0, "exclusive", urgent_exclusive=False) == "shared"
    with pytest.raises(ValueError, match="unknown service-time lanes 'per-job'"):
        latency_lane(0, "per-job")


def test_measured_shares_bound_the_throughput_instead_of_the_stage_timings() -> None:
    """Five routine jobs, 10 s latency, 5 s share of the server's wall time each, four
    slots: the first two finish at their latency (10 s), the third and fourth when the
    server has spent 15 and 20 s on the jobs so far; the fifth starts when the first
    slot frees (10 s), runs 10 s and the shares ahead of it with its own add up to 25 s.
    Without shares the stage timings bound it: max(6 k / 2, 4 k) = 4 k for k jobs."""
    shared = JobEstimate(6.0, 4.0, 10.0, 0.0, "fitted", share_s=5.0)
    jobs = [Entry(f"j{i}", 2, False, 1000.0, None, shared) for i in range(5)]
    capacity = Capacity(cpu_workers=2, devices=1, max_running=4)
    assert [e.finish for e in walk(jobs, 0.0, capacity)] == [10.0, 10.0, 15.0, 20.0, 25.0]
    assert walk(jobs, 0.0, capacity)[4].start == 10.0
    plain = [_entry(i) for i in range(5)]
    assert [e.finish for e in walk(plain, 0.0, capacity)] == [10.0, 10.0, 12.0, 16.0, 20.0]


def test_a_running_jobs_share_counts_for_the_part_of_its_latency_left() -> None:
    """Started 4 s into a 10 s latency: 60 % of its 5 s share is left (3 s); the queued
    job behind it adds its 5 s: max(its latency 10 s, 3 + 5) = 10 s, and with a 20 s
    share 3 + 20 = 23 s."""
    running = Entry("r", 2, True, 1000.0, 96.0, JobEstimate(6.0, 4.0, 10.0, 0.0, "f", 5.0))
    queued = Entry("q", 2, False, 1000.0, None, JobEstimate(6.0, 4.0, 10.0, 0.0, "f", 5.0))
    heavy = Entry("h", 2, False, 1000.0, None, JobEstimate(6.0, 4.0, 10.0, 0.0, "f", 20.0))
    capacity = Capacity(max_running=4)
    assert walk([running, queued], 100.0, capacity)[1].finish == pytest.approx(110.0)
    assert walk([running, heavy], 100.0, capacity)[1].finish == pytest.approx(123.0)


def test_an_overtaking_routine_arrival_holds_its_share_and_urgent_its_latency() -> None:
    shared = JobEstimate(6.0, 4.0, 10.0, 0.0, "fitted", share_s=2.5)
    capacity = Capacity(cpu_workers=2, devices=1, urgent_exclusive=True)
    assert capacity.hold_s(1, shared) == 2.5
    assert capacity.hold_s(0, shared) == 10.0
    assert capacity.hold_s(1, EST) == 4.0  # no share: max(6 / 2, 4 / 1)


def test_a_running_jobs_share_left_is_its_share_less_what_it_has_had() -> None:
    """A cold start learned a 4 s latency; the job has run 6 s beside three others and
    had 1.5 s of its 5 s share: 3.5 s of the server's time are left, where its latency
    left (at least 5 % of 4 s) made it look done. The queued job behind it (20 s share)
    finishes when both are through: 100 + 3.5 + 20."""
    running = Entry("r", 2, True, 1000.0, 94.0, JobEstimate(2, 2, 4.0, 0, "f", 5.0), 1.5)
    heavy = Entry("h", 2, False, 1000.0, None, JobEstimate(2, 2, 4.0, 0, "f", 20.0))
    measured = walk([running, heavy], 100.0, Capacity(max_running=4))
    assert measured[1].finish == pytest.approx(123.5)
    by_latency = walk([running, heavy], 100.0, Capacity(max_running=4, share_left="latency"))
    assert by_latency[1].finish == pytest.approx(100.0 + 0.05 * 5.0 + 20.0)


def test_a_starved_running_jobs_share_left_is_the_work_it_has_left() -> None:
    """A routine job running beside better-ranked work is charged an equal split of the
    wall time while its units wait: it has had 4.5 s of its 5 s share but done 1 s of its
    4 s of stage work. By share (``measured``) it looks done (0.5 s left); by progress
    (``progress``) 75 % of its share is left, 3.75 s; past 95 % of its work, 5 % is left.
    Without its stage seconds, progress falls back on the share it has had."""
    est = JobEstimate(2, 2, 4.0, 0, "f", 5.0)
    starved = Entry("r", 2, True, 1000.0, 90.0, est, 4.5, 1.0)
    heavy = Entry("h", 2, False, 1000.0, None, JobEstimate(2, 2, 4.0, 0, "f", 20.0))
    by_share = walk([starved, heavy], 100.0, Capacity(max_running=4))
    assert by_share[1].finish == pytest.approx(100.0 + 0.5 + 20.0)
    progress = Capacity(max_running=4, share_left="progress")
    assert walk([starved, heavy], 100.0, progress)[1].finish == pytest.approx(123.75)
    nearly = Entry("r", 2, True, 1000.0, 90.0, est, 4.5, 3.99)
    assert walk([nearly, heavy], 100.0, progress)[1].finish == pytest.approx(120.25)
    unknown = Entry("r", 2, True, 1000.0, 90.0, est, 4.5)
    assert walk([unknown, heavy], 100.0, progress)[1].finish == pytest.approx(120.5)


def test_running_jobs_ranked_behind_a_queued_job_still_take_their_share() -> None:
    """An INPATIENT job queued ahead of a running OUTPATIENT job (4 s of its share left)
    waits through that share too: 100 + 8 + 4 s (its own latency, 10 s, is shorter). An
    URGENT job does not: under urgent_exclusive routine work is held while it runs."""
    behind = Entry("o", 2, True, 1000.0, 98.0, JobEstimate(2, 2, 10.0, 0, "f", 5.0), 1.0)
    inpatient = Entry("i", 1, False, 1000.0, None, JobEstimate(2, 2, 10.0, 0, "f", 8.0))
    urgent = Entry("u", 0, False, 1000.0, None, JobEstimate(2, 2, 10.0, 0, "f", 12.0))
    capacity = Capacity(max_running=4, running_behind=True)
    assert walk([inpatient, behind], 100.0, capacity)[0].finish == pytest.approx(112.0)
    alone = Capacity(max_running=4)  # the default: not counted
    assert walk([inpatient, behind], 100.0, alone)[0].finish == pytest.approx(110.0)
    assert walk([urgent, behind], 100.0, capacity)[0].finish == pytest.approx(112.0)


def test_later_arrivals_ranked_with_or_behind_a_routine_job_take_time_beside_its_run() -> None:
    """OUTPATIENT arrivals at 0.1/s during a 10 s run, each taking 2 s of the wall time
    beside it (Capacity.beside_s): 2 s more for an OUTPATIENT or INPATIENT job (they rank
    with or behind both), none for an URGENT one (it runs alone) or with beside_s 0."""
    own = JobEstimate(2, 2, 10.0, 0, "f", 10.0)
    arrivals = (Arrivals(2, 0.1, own),)
    capacity = Capacity(max_running=4, arrivals=arrivals, beside_s=2.0)
    for cls, expected in ((2, 112.0), (1, 112.0), (0, 110.0)):
        job = Entry("j", cls, False, 1000.0, None, own)
        assert walk([job], 100.0, capacity)[0].finish == pytest.approx(expected)
    none = Capacity(max_running=4, arrivals=arrivals)
    assert walk([Entry("j", 2, False, 1000.0, None, own)], 100.0, none)[0].finish == 110.0


def test_the_band_can_count_the_noise_of_the_work_ahead() -> None:
    """``Capacity.band: ahead`` (session 18, not the default): a job's band adds the
    noise of the shares ranked ahead of it, each its latency's relative spread times its
    share, as independent noises (sqrt of the summed squares); the finish is unchanged."""
    noisy = JobEstimate(6.0, 4.0, 10.0, 1.0, "fitted", share_s=5.0)
    jobs = [Entry(f"j{i}", 2, False, 1000.0, None, noisy) for i in range(5)]
    own, ahead = (walk(jobs, 0.0, Capacity(band=band)) for band in ("own", "ahead"))
    assert [e.finish for e in own] == [e.finish for e in ahead]
    z = 1.2816 * 1.4826
    assert [e.finish_late - e.finish for e in own] == pytest.approx([z * 1.0] * 5)
    # four shares ahead of the fifth, each 0.1 x 5 s of noise, with its own 1 s
    assert ahead[4].finish_late - ahead[4].finish == pytest.approx(z * (1.0 + 4 * 0.25) ** 0.5)


def test_a_running_jobs_work_done_is_its_step_seconds_and_is_recorded() -> None:
    """The stage seconds a running job has so far, as the scheduler adds them: steps
    only (not its wait, the totals, the paused part inside its steps, or its share),
    and a walk's record keeps them for a replay."""
    from radserve.turnaround.replay import walk_inputs, walk_record
    from radserve.turnaround.service_time import work_done

    timings = {
        "ingest": 0.5,
        "lesions: prepare": 0.25,
        "lesions: infer": 1.0,
        "paused": 0.2,
        "queue": 3.0,
        "run": 9.0,
        "share": 2.0,
    }
    assert work_done(timings.items()) == pytest.approx(1.75)
    est = JobEstimate(2, 2, 4.0, 0, "f", 5.0)
    entries = [
        Entry("r", 2, True, 1000.0, 90.0, est, 1.5, 1.75),
        Entry("q", 2, False, 1000.0, None, est),
        Entry("s", 2, True, 1000.0, 95.0, JobEstimate(2, 2, 4.0, 0, "f"), None, 0.5),
    ]
    _, back, _ = walk_inputs(walk_record(100.0, entries, Capacity(), {"r": 40}))
    assert back == entries


@pytest.mark.parametrize("shared", [False, True], ids=["cpu-device", "measured-share"])
def test_a_running_job_is_not_charged_queued_work_that_starts_only_after_it(
    shared: bool,
) -> None:
    """Session 36: at max_running 1, a running OUTPATIENT job ranked behind two queued
    INPATIENT ones was charged their work: predicted 35 s late, it finished in 0.6 s, and
    a false deadline-risk alert was raised. They wait for the slot it holds."""
    est = EST if not shared else JobEstimate(6.0, 4.0, 10.0, 0.0, "fitted", share_s=10.0)

    def entry(i: int, cls: int, running: bool = False) -> Entry:
        started = 95.0 if running else None
        return Entry(f"j{i}", cls, running, deadline=1000.0, started=started, estimate=est)

    queue = [entry(1, 1), entry(2, 1), entry(0, 2, running=True)]
    one_slot = walk(queue, 100.0, Capacity(max_running=1))
    running = one_slot[2]
    assert running.finish == pytest.approx(105.0)  # its own 5 s left, nothing else
    assert one_slot[0].start == pytest.approx(105.0)  # the queued ones wait for its slot
    # with a free slot the first queued job runs beside it, and is charged to it
    two_slots = walk(queue, 100.0, Capacity(max_running=2))
    assert two_slots[0].start == 100.0 and two_slots[2].finish > 105.0
    # as before session 36: every queued job ahead charged
    before = walk(queue, 100.0, Capacity(max_running=1, queued_ahead="all"))
    assert before[2].finish >= 110.0


def test_later_arrivals_never_take_more_than_the_whole_server() -> None:
    """Just after a start every class's rate is its prior pseudo-arrival over seconds, so
    the classes ahead of a slow study bring more work per second than the server has:
    they are scaled down to all of it (their share of the server times the horizon, each
    step), not to hours; below that load the allowance is the compound Poisson mean."""
    slow = JobEstimate(cpu_s=30.0, device_s=30.5, latency_s=60.5, spread_s=0.0, source="prior")
    prior = tuple(Arrivals(c, 0.1, slow) for c in (0, 1, 2))
    capacity = Capacity(arrivals=prior, tat_s=TATS, host_cores=2)
    alone = Entry("j", 2, False, deadline=1800.0, started=None, estimate=slow)
    (eta,) = walk([alone], 0.0, capacity)
    # step one: at most the horizon (60.5 s) again; step two: at most 2 x 60.5 s
    assert 60.5 < eta.finish <= 3 * 60.5 + 1e-9
    assert eta.finish < alone.deadline  # no deadline risk for a study alone on the server
    mean, _ = overtaking_delay(alone, 100.0, 0.0, capacity)
    assert mean <= 200.0 + 1e-9  # step two: at most its window, the horizon and step one
    light = Capacity(arrivals=(Arrivals(0, 1 / 200, slow),), tat_s=TATS, host_cores=2)
    r, h = 1 / 200, slow.latency_s  # 0.3 of the server: as before
    assert overtaking_delay(alone, 100.0, 0.0, light)[0] == pytest.approx(
        r * (100.0 + r * 100.0 * h) * h
    )
