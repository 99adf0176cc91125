"""``python scripts/testbed_pilot.py ...`` is ``python -m capo_trl.harness.pilot ...`` (the driver
lives in the harness; this name is kept for the commands recorded with the results)."""

from capo_trl.harness.pilot import main, render, verdict  # noqa: F401

if __name__ == "__main__":
    main()
