"""Estimators: a model, a machine, a layout and a workload in; a broken-down prediction out.

``zrt_core.estimate.training.estimate_training`` predicts one training step.
"""
