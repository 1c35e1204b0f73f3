"""swap_forward's record survives copy.deepcopy and pickle: put back on a copy gives the copy its class forward."""

from __future__ import annotations

import copy
import pickle

from kernel_hub.layers import swap
from kernel_hub.layers.swap import MISSING, put_back_forward, swap_forward


class Box:
    def forward(self) -> str:
        return "class"


def _replacement() -> str:
    return "swapped"


def test_a_copied_record_of_nothing_puts_nothing_back() -> None:
    box = Box()
    previous = swap_forward(box, _replacement)
    assert previous is MISSING and box.forward() == "swapped"
    for copied_box, copied_previous in (copy.deepcopy((box, previous)), pickle.loads(pickle.dumps((box, previous)))):
        assert copied_previous is swap.MISSING
        put_back_forward(copied_box, copied_previous)
        assert "forward" not in copied_box.__dict__ and copied_box.forward() == "class"
    assert box.forward() == "swapped"  # the original keeps its swap
    put_back_forward(box, previous)
    assert box.forward() == "class"


def test_a_copied_record_of_an_instance_forward_puts_that_back() -> None:
    box = Box()
    box.__dict__["forward"] = _replacement
    previous = swap_forward(box, lambda: "other")
    copied_box, copied_previous = copy.deepcopy((box, previous))
    put_back_forward(copied_box, copied_previous)
    assert copied_box.forward() == "swapped"
