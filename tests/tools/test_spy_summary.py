"""tools/profiling/spy_summary.py: py-spy's folded stacks summed by function, within a frame or over all."""
from tools.profiling import spy_summary


def test_functions_are_summed_inclusive_and_by_themselves_below_the_frame_asked(tmp_path):
    path = tmp_path / "spy.txt"
    path.write_text("main (a.py:1);step (loop.py:10);draw (loop.py:20) 6\n"
                    "main (a.py:1);step (loop.py:11);write (io.py:5) 3\n"
                    "main (a.py:1);idle (a.py:9) 11\n"
                    "not a stack line\n")
    total, inclusive, alone = spy_summary.summary(spy_summary.read(str(path)), "step (")
    assert total == 9  # (the idle samples are not under step)
    assert inclusive["step (loop.py)"] == 9 and inclusive["draw (loop.py)"] == 6 and "main (a.py)" not in inclusive
    assert alone == {"draw (loop.py)": 6, "write (io.py)": 3}
    total, inclusive, alone = spy_summary.summary(spy_summary.read(str(path)), None)
    assert total == 20 and inclusive["main (a.py)"] == 20 and alone["idle (a.py)"] == 11
