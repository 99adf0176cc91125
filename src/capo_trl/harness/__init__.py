"""The experiment harness: methods side by side on the embedded default (``capo-trl demo``,
``compare`` and ``calibrate-mask``). Nothing in the production path (``train``, ``trainer``,
``config``, ``data``, ``evaluation``) imports it.

- :mod:`~capo_trl.harness.presets`: the method presets, the budget, their checks.
- :mod:`~capo_trl.harness.paired`: the paired interval of two methods over the same seeds.
- :mod:`~capo_trl.harness.runs`: one run (train one method with one seed) and the test evaluation.
- :mod:`~capo_trl.harness.driver`: every method x every seed, saved per run and resumed (here or in worker processes).
- :mod:`~capo_trl.harness.compare`: ``capo-trl compare``: several methods and seeds through the driver, reported.
- :mod:`~capo_trl.harness.demo`: GRPO and CAPO side by side, before and after.
- :mod:`~capo_trl.harness.calibrate_mask`: tau and the mask thresholds of a reference model.
- :mod:`~capo_trl.harness.pilot`, :mod:`~capo_trl.harness.testbed`: the test-bed studies, through the driver.
"""
