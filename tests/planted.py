"""Planted faults for the plugin's own tests: wrong reuse policies and a broken reference."""

from __future__ import annotations

import time

from pytest_schedfuzz.model.scenario import Scenario, SchedParams
from pytest_schedfuzz.model.trace import Trace
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


def ignore_max_nodes(new: SchedParams, cur: SchedParams) -> bool:
    return new.parallel == cur.parallel and new.op_offload == cur.op_offload


class WithoutPass2(Scheduler):
    def pass2_expand(self, g, ids) -> None:  # type: ignore[no-untyped-def]
        """Pass 2 removed: nothing is expanded to neighbours."""


def predict_without_pass2(scenario: Scenario) -> Trace:
    return predict(scenario, WithoutPass2)
