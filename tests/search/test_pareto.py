"""Pareto fronts on hand-made points."""

from __future__ import annotations

from zrt_core.search.pareto import pareto_front


def test_front_of_throughput_against_memory() -> None:
    rows = [{"t": 10, "m": 50},  # 0: fastest
            {"t": 8, "m": 30},   # 1: slower, smaller: on the front
            {"t": 8, "m": 40},   # 2: dominated by 1 (same speed, more memory)
            {"t": 5, "m": 35},   # 3: dominated by 1
            {"t": 4, "m": 20},   # 4: smallest: on the front
            {"t": 10, "m": 60},  # 5: dominated by 0
            {"t": None, "m": 1}]  # 6: no value: ignored
    assert pareto_front(rows, "t", "m", y_max=False) == [0, 1, 4]


def test_identical_points_are_all_kept_and_both_maximised() -> None:
    rows = [{"a": 1, "b": 3}, {"a": 3, "b": 1}, {"a": 2, "b": 2}, {"a": 2, "b": 2},
            {"a": 1, "b": 1}]
    # (1,1) is dominated by every other point; the two (2,2) tie and neither dominates
    assert pareto_front(rows, "a", "b") == [1, 2, 3, 0]


def test_equal_y_at_smaller_x_is_dominated() -> None:
    rows = [{"x": 5, "y": 5}, {"x": 4, "y": 5}, {"x": 3, "y": 6}]
    assert pareto_front(rows, "x", "y") == [0, 2]


def test_minimising_both() -> None:
    rows = [{"g": 8, "s": 4.0}, {"g": 16, "s": 2.1}, {"g": 32, "s": 2.5}, {"g": 64, "s": 1.0}]
    assert pareto_front(rows, "g", "s", x_max=False, y_max=False) == [0, 1, 3]


def test_matches_brute_force_on_a_grid() -> None:
    import itertools

    rows = [{"x": x, "y": (x * 7 + y * 3) % 5} for x, y in itertools.product(range(6), range(6))]

    def dominated(p: dict, q: dict) -> bool:
        return q["x"] >= p["x"] and q["y"] >= p["y"] and (q["x"] > p["x"] or q["y"] > p["y"])

    brute = {i for i, p in enumerate(rows) if not any(dominated(p, q) for q in rows)}
    assert set(pareto_front(rows, "x", "y")) == brute
