"""The campaign outlives a process that dies while checking a batch (`campaign.run_chunk_isolated`)."""

from __future__ import annotations

import os
import pathlib
import signal
import time

from tests.fuzz import campaign, checker

CRASH_ONCE = "JGNN_FUZZ_TEST_CRASH_ONCE"  # a marker path: the fake check's first process dies on its 2nd batch
SLEEP = "JGNN_FUZZ_TEST_SLEEP"  # seconds the fake check takes per batch
_calls = [0]  # batches this process checked


def crashing_check(batch) -> checker.BatchResult:
    """Checks nothing, except that the first process to check two batches dies of SIGSEGV on its second (it
    leaves the marker ``$JGNN_FUZZ_TEST_CRASH_ONCE`` first, so the process that resumes the chunk does not).
    Which batch that is is the child's business: a child draws the chunk from its seed alone."""
    _calls[0] += 1
    marker = pathlib.Path(os.environ[CRASH_ONCE])
    if _calls[0] == 2 and not marker.exists():
        marker.touch()
        os.kill(os.getpid(), signal.SIGSEGV)
    time.sleep(float(os.environ.get(SLEEP, "0")))
    return checker.BatchResult(len(batch.pairs), [])


def test_a_segfault_is_recorded_on_its_batch_and_the_chunk_goes_on(tmp_path, monkeypatch):
    monkeypatch.setenv(CRASH_ONCE, str(tmp_path / "crashed"))
    found, cases, checked, _ = campaign.campaign(10**6, 7, 4, check="tests.fuzz.test_campaign:crashing_check",
                                                 log=lambda s: None, max_chunks=1)

    assert checked == 4 and cases > 0  # batches 0, 1 (the crash), then 2 and 3 in a second process
    assert (tmp_path / "crashed").exists()
    [(sig, fd)] = found.items()
    assert (fd.failure.kind, fd.failure.mode, fd.failure.where, fd.count) == ("crash", "process", "SIGSEGV", 1)
    assert fd.chunk_seed == 7 and fd.failure.case in fd.batch.cases()
    assert campaign.to_shrink(found, "class") == []  # replaying it would kill the campaign

    campaign.write_report(tmp_path / "out", found, cases, checked, 1.0, 7)
    [script] = (tmp_path / "out").glob("repro_*.py")
    assert "checker.check_batch(batch)" in script.read_text()


def test_the_campaign_stops_at_its_case_count(tmp_path, monkeypatch):
    (tmp_path / "crashed").touch()  # no crash
    monkeypatch.setenv(CRASH_ONCE, str(tmp_path / "crashed"))
    monkeypatch.setenv(SLEEP, "1")
    found, cases, checked, _ = campaign.campaign(1, 3, 50, jobs=2, check="tests.fuzz.test_campaign:crashing_check",
                                                 log=lambda s: None)
    # Two chunks start at once. The parent reads results every 2 s and then stops both: far fewer than their 100
    # batches (100 s) run, and no third chunk starts.
    assert found == {} and 1 <= checked < 50 and cases >= 1
