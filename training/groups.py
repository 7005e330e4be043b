"""Groups of training texts (dataset x prompt style) and what `fit` does with them.

A deployment sees one kind of traffic, and the issue's targets are PRR within each dataset,
so a score is judged on how it ranks answers *within* a group. Pooled over groups, most of
the target's variance is which group a text is from (GSM8K and MedQuAD answers are almost
all wrong, SQuAD's a third right): a regressor fitted on pooled targets spends itself on
recognising the group. Two tools against that, both chosen by cross-validation in `fit`:

- selection by the mean within-group PRR of the held-out folds (over the groups whose
  accuracy is informative), instead of the pooled PRR;
- within-group centring: each text's training target less its group's mean (plus the mean
  over all texts, so targets stay near [0, 1] where the scorer clips confidences), so the
  regressors learn only what separates right from wrong answers to the same kind of question.
  Partial centring removes a share of the group's offset (`group-0.5`, `group-0.25`): the
  regressors are linear in their targets, so this is close to a weighted mean of the fully centred
  model and the raw one, a within-group ranking that keeps part of the between-group level a
  deployment with mixed traffic needs (fully centred, pooled PRR falls from about 0.64 to 0.20).
  Group means are taken over all texts given to `fit`, a held-out fold's included: a shift
  per group cannot reorder the group's held-out texts, and it moves the fitted model only
  through the held-out fold's share (a fifth) of a group mean, the group's level, which says
  nothing about which of its answers are right.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from enum import StrEnum

import numpy as np

from training.rejection import accuracy, informative, prediction_rejection_ratio
from training.two_stage import FitText


class Selection(StrEnum):
    POOLED = "pooled"  # PRR over all held-out texts together
    WITHIN_GROUP = "within-group"  # mean PRR within each informative group of held-out texts


class TargetCentring(StrEnum):
    """How much of each group's offset from the overall mean target the regressors do not learn; in the
    order `fit` tries them."""

    NONE = "none"
    GROUP_QUARTER = "group-0.25"
    GROUP_HALF = "group-0.5"
    GROUP = "group"  # each group's mean target removed entirely

    @property
    def strength(self) -> float:
        """The share of each group's offset from the overall mean that is removed."""
        if self is TargetCentring.NONE:
            return 0.0
        if self is TargetCentring.GROUP:
            return 1.0
        return float(self.value.removeprefix("group-"))


def informative_groups(texts: Sequence[FitText]) -> frozenset[str]:
    """Groups whose accuracy is informative (docs/method.md §6), judged on all texts' targets."""
    by_group: dict[str, list[float]] = {}
    for text in texts:
        by_group.setdefault(text.group, []).append(text.target)
    return frozenset(g for g, targets in by_group.items() if informative(accuracy(np.array(targets))))


def centred(texts: Sequence[FitText], centring: TargetCentring) -> list[FitText]:
    """The texts with offsets that move each group's mean training target `centring.strength` of the way
    to the overall mean (all the way for `GROUP`)."""
    if centring is TargetCentring.NONE or not texts:
        return [t if t.offset == 0.0 else replace(t, offset=0.0) for t in texts]
    overall = float(np.mean([t.target for t in texts]))
    sums: dict[str, list[float]] = {}
    for text in texts:
        sums.setdefault(text.group, []).append(text.target)
    means = {group: float(np.mean(values)) for group, values in sums.items()}
    return [replace(t, offset=centring.strength * (means[t.group] - overall)) for t in texts]


def within_group_prr(scores: np.ndarray, texts: Sequence[FitText], groups: frozenset[str]) -> float:
    """Mean PRR within each of `groups` present among `texts` (NaN where none has a finite PRR)."""
    names = np.array([t.group for t in texts])
    targets = np.array([t.target for t in texts])
    return mean_prr_within(scores, targets, names, groups)


def mean_prr_within(scores: np.ndarray, targets: np.ndarray, names: np.ndarray, groups: frozenset[str]) -> float:
    """Mean PRR within each of `groups` among `names` (each text's group), NaN where none has a finite PRR."""
    values = []
    for group in sorted(groups & set(names)):
        mask = names == group
        value = prediction_rejection_ratio(scores[mask], targets[mask])
        if math.isfinite(value):
            values.append(value)
    return float(np.mean(values)) if values else math.nan
