"""Evaluation: sampling scored completions, ``evaluate()``, the calibration metrics (pure math),
calibrated P(correct) and abstention, test-time scaling, ``CalibrationCallback`` and every plot."""
