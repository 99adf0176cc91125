"""The grouped-data model of the selective-answering tests, shared with ``scripts/selective_check.py``."""

import numpy as np
from scipy.stats import norm

_MU = np.linspace(0, 1, 2002)[1:-1]  # quantiles of a question's score level, for the true precision


def grouped(m, n, rng, easy=(1.76, 0.24)):
    """40% easy questions (accuracy ~ Beta(easy), mean 0.88 by default), the rest accuracy U(0, 0.5) and
    lower scores; a question's samples share its score level (sd 0.02 around it) and its accuracy,
    so the score says nothing within a question type: the truth is flat."""
    is_easy = rng.random(m) < 0.4
    accuracy = np.where(is_easy, rng.beta(*easy, m), rng.uniform(0, 0.5, m))
    level = np.where(is_easy, rng.uniform(-0.5, 0, m), rng.uniform(-2, -0.5, m))
    s = np.repeat(level, n) + rng.normal(0, 0.02, m * n)
    return s, (rng.random(m * n) < np.repeat(accuracy, n)).astype(int), np.repeat(np.arange(m), n)


def grouped_precision(cut, easy_mean=0.88):
    """True precision of answering s >= cut on new questions from :func:`grouped`."""
    p_easy = norm.sf((cut - (-0.5 + 0.5 * _MU)) / 0.02).mean()
    p_hard = norm.sf((cut - (-2 + 1.5 * _MU)) / 0.02).mean()
    return (0.4 * p_easy * easy_mean + 0.6 * p_hard * 0.25) / (0.4 * p_easy + 0.6 * p_hard)
