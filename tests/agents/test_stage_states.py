"""A stage's state machine alone (agents/stage_states.py): no process, no supervisor thread."""

from __future__ import annotations

import pytest

from agents import stage_states
from agents.admission import Admitted
from agents.restart_policy import RestartPolicy
from agents.stage_record import StageRecord
from contracts.stage_status import StageStatus

POLICY = RestartPolicy(max_restarts=2, backoff_s=1.0)


def record(state: str = "starting") -> StageRecord:
    status = StageStatus("d1-r0-s0", 1, 0, 0, state)
    return StageRecord("d1-r0-s0", ({}, None), Admitted({}, None, 0), status)


def test_a_crash_restarts_after_a_growing_backoff_and_fails_past_the_limit():
    stage = record()
    stage_states.spawned(stage.status, 100)
    assert stage_states.ready(stage.status)
    stage_states.process_exited(stage, -9, POLICY, 10.0, why=lambda: "killed by SIGKILL")
    status = stage.status
    assert (status.state, status.pid, status.exit_code, status.restarts) == ("starting", None, -9, 1)
    assert status.message == "killed by SIGKILL; restart 1/2 in 1.0 s" and stage.restart_at == 11.0
    stage_states.spawned(status, 101)
    assert status.message.startswith("killed")  # the crash is still told until the stage is ready
    stage_states.process_exited(stage, 1, POLICY, 20.0, why=lambda: "exit code 1")
    assert status.message == "exit code 1; restart 2/2 in 2.0 s" and stage.restart_at == 22.0
    stage_states.spawned(status, 102)
    stage_states.process_exited(stage, 1, POLICY, 30.0, why=lambda: "exit code 1")
    assert (status.state, status.message) == ("failed", "exit code 1; gave up after 2 restarts")


def test_an_exit_on_request_or_with_code_0_is_not_a_crash():
    asked = record()
    stage_states.spawned(asked.status, 100)
    stage_states.draining(asked.status)
    asked.stop_requested = True
    stage_states.process_exited(asked, -15, POLICY, 0.0, why=pytest.fail)
    assert (asked.status.state, asked.status.message) == ("exited", "stopped on request")
    done = record()
    stage_states.spawned(done.status, 100)
    stage_states.process_exited(done, 0, POLICY, 0.0, why=pytest.fail)
    assert (done.status.state, done.status.message, done.restart_at) == (
        "exited", "exited on its own with code 0", None)


def test_ready_counts_only_while_starting_and_a_new_spec_starts_again():
    status = record().status
    stage_states.spawned(status, 100)
    status.broken_stage = 2
    assert stage_states.ready(status) and (status.state, status.message) == ("ready", "")
    assert not stage_states.ready(status)
    stage_states.respecced(status, "digest-2")
    assert (status.state, status.broken_stage, status.spec_digest) == ("starting", None, "digest-2")
    stage_states.draining(status)
    assert not stage_states.ready(status) and status.state == "draining"  # a late ready while stopping


def test_a_stop_without_a_process_keeps_a_failure_and_its_reason():
    refused = record()
    stage_states.failed(refused.status, "refused: no device fits")
    stage_states.stopped_without_process(refused.status)
    assert (refused.status.state, refused.status.message) == ("failed", "refused: no device fits")
    waiting = record()  # crashed, waiting out its backoff
    stage_states.stopped_without_process(waiting.status)
    assert (waiting.status.state, waiting.status.message) == ("exited", "stopped on request")


def test_a_move_the_table_does_not_allow_is_refused():
    assert set(stage_states.MOVES) == {"starting", "ready", "draining", "exited", "failed"}
    status = record("failed").status
    with pytest.raises(stage_states.IllegalMove, match="failed -> starting"):
        stage_states.spawned(status, 100)
    with pytest.raises(stage_states.IllegalMove, match="exited -> draining"):
        stage_states.draining(record("exited").status)
