"""Write src/capo_trl/cli/train_flags.json: `capo-trl train`'s real parser, described for the fast path.

    python scripts/train_flags.py          # rewrite the file
    python scripts/train_flags.py --check  # exit 1 when the file is stale

Run it after changing a field of ScriptArguments, CAPOConfig or the parser's description, or after
upgrading TRL, transformers or accelerate; tests/test_train_flags.py fails until then.
"""

import argparse
import sys
from pathlib import Path

from capo_trl.cli import train_flags

FILE = Path(__file__).resolve().parent.parent / "src" / "capo_trl" / "cli" / train_flags.FILE


def current() -> str:
    """The file's text as the installed TRL, transformers and accelerate make the parsers."""
    from accelerate.commands.launch import launch_command_parser

    from capo_trl.cli.train_args import make_parser

    return train_flags.render(train_flags.describe(make_parser(), launch_command_parser()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="only say whether the file is current (exit 1 if not)")
    args = ap.parse_args()
    text = current()
    if args.check:
        stale = not FILE.is_file() or FILE.read_text(encoding="utf-8") != text
        print(f"{FILE}: {'stale: run python scripts/train_flags.py' if stale else 'current'}")
        return int(stale)
    FILE.write_text(text, encoding="utf-8")
    print(f"wrote {FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
