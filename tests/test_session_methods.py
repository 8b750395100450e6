"""The worker's session owns its state: the loader and the trainer tell it what they know
through its methods (mxlbbsp.worker.session), and no other module writes its attributes."""
import ast

from conftest import ROOT
from mxlbbsp.worker.session import Session

#: the names the session goes by in the modules that use it (``sess``, ``self.sess``, ...)
SESSION_NAMES = {"sess", "session", "_session"}


def _writes_to_a_session(tree):
    """(line, target) of each assignment to an attribute of something named as a session."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        else:
            continue
        for target in targets:
            for e in target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]:
                if not isinstance(e, ast.Attribute):
                    continue
                owner = e.value
                name = owner.id if isinstance(owner, ast.Name) else \
                    owner.attr if isinstance(owner, ast.Attribute) else None
                if name in SESSION_NAMES:
                    yield node.lineno, ast.unparse(e)


def test_no_module_but_the_sessions_own_writes_its_attributes():
    session_py = ROOT / "mxlbbsp" / "worker" / "session.py"
    found = []
    for path in sorted((ROOT / "mxlbbsp").rglob("*.py")):
        if path == session_py:
            continue
        for line, target in _writes_to_a_session(ast.parse(path.read_text())):
            found.append(f"{path.relative_to(ROOT)}:{line}: {target} = ...")
    assert not found, "\n".join(found)


def _single_process(B=32, N=100):
    return Session(B, N, B, env={})


def test_a_resumed_epoch_numbers_iterations_from_the_checkpoint_once():
    s = _single_process()
    s.begin_epoch(4, 0)                 # an epoch the checkpoint has done: nothing resumes
    assert (s.epoch_length, s.iteration, s.first_iteration) == (4, -1, 0)
    s.begin_epoch(4, 7)
    assert (s.iteration, s.first_iteration) == (6, 7)
    assert s.next_iteration(32) == (7, 0, 32)
    s.begin_epoch(4, 7)                 # the next epoch goes on from where the job is
    assert (s.iteration, s.first_iteration) == (7, 7)


def test_a_replay_applies_the_recorded_learning_rate_factors():
    s = _single_process()
    s.follow(True, [0.5, 0.25])
    s.next_iteration(32)
    assert s.lr_factor() == 0.5
    s.next_iteration(16)
    assert s.lr_factor() == 0.25


def test_announced_batches_and_the_model_are_kept_until_told_otherwise():
    s = _single_process()
    assert s.next_global_batch() == 32      # the global batch size until announced
    s.announce(20, 32)
    assert s.next_global_batch() == 20
    s.describe_model({"batchnorm": True})
    s.describe_model({"batchnorm": False})  # the first report carries the first description
    assert s.model_info == {"batchnorm": True}

