"""Uncertainty methods shared by serving and training: TAD features, scorer, baselines, artifacts."""
