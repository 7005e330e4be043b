"""Offline TAD training: generate traces, fit the two-stage regressor, evaluate, calibrate."""
