"""The campaign outlives a process that dies while checking a batch (`campaign.run_chunk_isolated`)."""

from __future__ import annotations

import os
import pickle
import signal
import time

from tests.fuzz import campaign, checker

CRASH_ON = "JGNN_FUZZ_TEST_CRASH_ON"  # a pickled batch: the fake check kills its process on that batch
SLEEP = "JGNN_FUZZ_TEST_SLEEP"  # seconds the fake check takes per batch


def crashing_check(batch) -> checker.BatchResult:
    """Checks nothing, except that it dies of SIGSEGV on the batch named by ``$JGNN_FUZZ_TEST_CRASH_ON``."""
    with open(os.environ[CRASH_ON], "rb") as fh:
        if pickle.load(fh) == batch:
            os.kill(os.getpid(), signal.SIGSEGV)
    time.sleep(float(os.environ.get(SLEEP, "0")))
    return checker.BatchResult(len(batch.pairs), [])


def _chunk(seed: int, batches: int) -> list:
    got = []
    campaign.run_chunk(seed, batches, got.append)
    return got


def test_a_segfault_is_recorded_on_its_batch_and_the_chunk_goes_on(tmp_path, monkeypatch):
    batches = _chunk(7, 4)
    (tmp_path / "crash").write_bytes(pickle.dumps(batches[1]))
    monkeypatch.setenv(CRASH_ON, str(tmp_path / "crash"))

    total = sum(len(b.pairs) for b in batches)  # reached at the chunk's last batch: no second chunk
    found, cases, checked, _ = campaign.campaign(total, 7, 4, check="tests.fuzz.test_campaign:crashing_check",
                                                 log=lambda s: None)

    assert (checked, cases) == (4, total)  # batches 0, 1 (the crash), then 2 and 3 in a second process
    [(sig, fd)] = found.items()
    assert (fd.failure.kind, fd.failure.mode, fd.failure.where, fd.count) == ("crash", "process", "SIGSEGV", 1)
    assert fd.batch == batches[1] and fd.chunk_seed == 7
    assert campaign.to_shrink(found, "class") == []  # replaying it would kill the campaign

    campaign.write_report(tmp_path / "out", found, cases, checked, 1.0, 7)
    [script] = (tmp_path / "out").glob("repro_*.py")
    assert "checker.check_batch(batch)" in script.read_text()


def test_the_campaign_stops_at_its_case_count(tmp_path, monkeypatch):
    (tmp_path / "crash").write_bytes(pickle.dumps(None))
    monkeypatch.setenv(CRASH_ON, str(tmp_path / "crash"))
    monkeypatch.setenv(SLEEP, "1")
    found, cases, checked, _ = campaign.campaign(1, 3, 50, jobs=2, check="tests.fuzz.test_campaign:crashing_check",
                                                 log=lambda s: None)
    # Two chunks start at once. The parent reads results every 2 s and then stops both: far fewer than their 100
    # batches (100 s) run, and no third chunk starts.
    assert found == {} and 1 <= checked < 50 and cases >= 1
