"""`study create` prints progress lines when its output is not a terminal (issue 46 item 8): the
printer it hands create_study, one line per clip for a short study, one per 5% for a long one,
always the last."""

from __future__ import annotations

import io

from evalkit.cli.study import progress_lines


def lines(total: int) -> list[str]:
    out = io.StringIO()
    step = progress_lines("study media", "clips", stream=out)
    for n in range(1, total + 1):
        step(n, total)
    return out.getvalue().splitlines()


def test_a_short_study_prints_a_line_per_clip():
    assert lines(3) == ["study media: 1/3 clips", "study media: 2/3 clips", "study media: 3/3 clips"]


def test_a_long_one_prints_a_line_per_5_percent_and_the_last():
    got = lines(400)
    assert len(got) == 20 and got[-1] == "study media: 400/400 clips"
    assert got[0] == "study media: 20/400 clips"
    assert all("\r" not in line for line in got)
