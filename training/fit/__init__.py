"""Cross-validated two-stage training of TAD and the artifact the server loads (`fit`'s library).

5-fold cross-validation split by record (a question's answers in both prompt styles share a
fold; training/folds.py); grid: attention convention x variant (leak-free,
algorithm1-literal, authors; training/two_stage.py) x stage-1 ridge alpha x stage-2 ridge
alpha x aggregation, then target centring within groups (training/groups.py), then row
weighting (training/weighting.py), selected by PRR at 50% rejection of the held-out folds (by
default the mean within each informative dataset/prompt-style group; pooled on request),
scored with the very scorer the server runs (recurrent, c_1 = p_1). Stage-1 predictions that
stage 2 trains on come from inner folds of each outer training set (nested by the same unit). The
best variant becomes the artifact's regressor; the others are kept beside it for
comparison. Memory: Gram matrices only (about (2 x folds + 6) x F^2 x 8 bytes at peak), never a
fold's feature matrix; attention rows are memory-mapped from the run shards.

    options.py           what a fit is asked for (FitOptions, the alpha and MLP grids)
    texts.py             the runs' answers as training texts
    cross_validation.py  folds, the candidates' held-out PRR, the choice per variant and convention, final fits
    trial_rule.py        when a trial (a centring, a weighting, an MLP average) replaces what was kept
    mlp.py               the optional stage-2 MLP: its grid search and which stage 2 is installed
    report.py            the cross-validation record (report/cv.json) and the manifest's summary of it
    artifact.py          writing the artifact folder and swapping it into place
    pipeline.py          run_fit: all of the above in order
"""
