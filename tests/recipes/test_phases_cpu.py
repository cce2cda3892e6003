"""The clock of the start-up and end-of-run lines (recipes/trainer/phases.py), on a clock the test moves."""

from recipes.trainer.phases import PhaseClock


def clock_at(times: list[float]) -> PhaseClock:
    """A PhaseClock started at 100.0 whose marks read `times` in turn."""
    readings = iter(times)
    return PhaseClock(100.0, now=lambda: next(readings))


def test_each_phase_is_the_time_since_the_mark_before_it():
    clock = clock_at([112.5, 112.55, 115.0, 123.0])
    for phase in ("imports", "observers", "process groups", "model"):
        clock.mark(phase)
    assert [name for name, _ in clock.phases] == ["imports", "observers", "process groups", "model"]
    assert [round(s, 2) for _, s in clock.phases] == [12.5, 0.05, 2.45, 8.0]
    assert round(clock.total_s(), 2) == 23.0


def test_the_line_names_the_rank_and_leaves_out_phases_under_a_tenth_of_a_second():
    clock = clock_at([112.5, 112.55, 115.0])
    for phase in ("imports", "observers", "process groups"):
        clock.mark(phase)
    assert clock.line(0) == "start-up on rank 0: 15.0 s (imports 12.5, process groups 2.5)"


def test_a_start_up_of_short_phases_says_so():
    clock = clock_at([100.01, 100.02])
    clock.mark("a")
    clock.mark("b")
    assert clock.line(3) == "start-up on rank 3: 0.0 s (every phase under 0.1 s)"


def test_sync_runs_before_every_reading():
    calls: list[str] = []
    readings = iter([101.0, 102.0])

    def now() -> float:
        calls.append("now")
        return next(readings)

    clock = PhaseClock(100.0, now=now, sync=lambda: calls.append("sync"))
    clock.mark("a")
    clock.mark("b")
    assert calls == ["sync", "now", "sync", "now"]
