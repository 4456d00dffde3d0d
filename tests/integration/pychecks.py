# SPDX-License-Identifier: Apache-2.0
"""What the Python checks of the integration tests share (lib.sh's pycheck
reads their output): an "ok: " line per check that held, a "FAIL: " line
and exit status 1 for the first that did not; waiting for a condition
with a deadline; the AUC of a click model's scores."""
import sys
import time


def fail(msg):
    print(f"FAIL: {msg}", flush=True)
    sys.exit(1)


def say(msg):
    print(f"ok: {msg}", flush=True)


def wait_for(cond, seconds):
    """Polls cond until it holds or seconds pass; whether it held."""
    end = time.monotonic() + seconds
    while not cond():
        if time.monotonic() >= end:
            return False
        time.sleep(0.002)  # poll interval of a condition with a deadline
    return True


def auc(scores, labels):
    """The area under the ROC curve: Mann-Whitney U by ranks, ties given
    their mean rank."""
    import numpy as np
    s, y = np.asarray(scores, dtype=np.float64), np.asarray(labels) > 0.5
    _, inv, counts = np.unique(s, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    ranks = ((ends - counts + 1 + ends) / 2.0)[inv]
    npos, nneg = y.sum(), (~y).sum()
    return float((ranks[y].sum() - npos * (npos + 1) / 2) / (npos * nneg))


def check_logged_auc(scores, labels, logged, tol=2e-3):
    """workerd's logged test AUC against that of PyTorch's weights' scores,
    within tol."""
    a_ref = auc(scores, labels)
    if not abs(a_ref - logged) <= tol:
        fail(f"workerd logged a test AUC of {logged}, PyTorch's weights give {a_ref:.4f}")
    say(f"and the test AUC workerd logged ({logged}) is that of PyTorch's weights ({a_ref:.4f})")
