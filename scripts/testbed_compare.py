"""``python scripts/testbed_compare.py ...`` is ``python -m capo_trl.harness.testbed ...`` (the driver
lives in the harness; this name is kept for the commands recorded with the results)."""

from capo_trl.harness.testbed import main, render, report, summarise  # noqa: F401

if __name__ == "__main__":
    main()
