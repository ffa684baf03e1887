from areal_cli.controller.admission import Admission
from areal_cli.controller.dataset import Cursor
from areal_cli.tasks import Problem


def test_admission_rule_bounds_groups_by_version():
    # B=2, η=1, v=0: (η+v+1)·B = 4 groups may be accepted + running.
    a = Admission(batch_size=2, max_staleness=1, max_concurrent=10)
    for _ in range(4):
        a.admit()
    assert not a.can_admit()
    a.finish(kept=True)  # accepted 1, running 3: still 4
    assert not a.can_admit()
    a.version = 1  # limit becomes 6
    assert a.can_admit()
    a.admit()
    a.admit()
    assert not a.can_admit()


def test_filtered_group_frees_its_slot():
    a = Admission(batch_size=1, max_staleness=0, max_concurrent=10)
    a.admit()
    assert not a.can_admit()
    a.finish(kept=False)
    assert a.can_admit()


def test_max_concurrent_caps_running():
    a = Admission(batch_size=8, max_staleness=4, max_concurrent=2)
    a.admit()
    a.admit()
    assert not a.can_admit()


def test_cursor_requeue_keeps_order_and_epoch_ids_unique():
    probs = [Problem(f"p{i}", "q", "a", {}) for i in range(3)]
    c = Cursor(probs, seed=0)
    drawn = [c.next() for _ in range(6)]
    ids = [pid for _, pid, _ in drawn]
    assert len(set(ids)) == 6 and sum("#e1" in i for i in ids) == 3
    assert [s for s, _, _ in drawn] == list(range(6))
    c.requeue(*drawn[4])
    c.requeue(*drawn[1])
    assert [c.next()[0] for _ in range(3)] == [1, 4, 6]  # oldest first, then the stream
    d = Cursor(probs, seed=0)
    d.load_state(c.state())
    assert [d.next()[1] for _ in range(3)] == [c.next()[1] for _ in range(3)]
