"""Planted faults for the plugin's own tests: wrong reuse policies and a broken reference."""

from __future__ import annotations

import os
import time
from pathlib import Path

from pytest_schedfuzz.model.scenario import Scenario, SchedParams
from pytest_schedfuzz.model.trace import Trace
from pytest_schedfuzz.sim.driver import can_reuse
from reference.predict import predict
from reference.sched import Scheduler


def ignore_op_offload(new: SchedParams, cur: SchedParams) -> bool:
    return new.parallel == cur.parallel and new.max_nodes <= cur.max_nodes


def never(new: SchedParams, cur: SchedParams) -> bool:
    return False


def never_slowly(new: SchedParams, cur: SchedParams) -> bool:
    """``never``, taking 0.3 s a call: its finding's shrink lasts seconds, for a Ctrl-C to land in."""
    time.sleep(0.3)
    return False


def never_once_told(new: SchedParams, cur: SchedParams) -> bool:
    """``can_reuse`` until the file named by ``$PLANTED_TRIGGER`` exists, ``never`` from then on:
    a finding that comes when a test says (after it has killed Redis, say)."""
    return can_reuse(new, cur) and not Path(os.environ["PLANTED_TRIGGER"]).exists()


def ignore_max_nodes(new: SchedParams, cur: SchedParams) -> bool:
    return new.parallel == cur.parallel and new.op_offload == cur.op_offload


class WithoutPass2(Scheduler):
    def pass2_expand(self, g, ids) -> None:  # type: ignore[no-untyped-def]
        """Pass 2 removed: nothing is expanded to neighbours."""


def predict_without_pass2(scenario: Scenario) -> Trace:
    return predict(scenario, WithoutPass2)
