"""``te-assembly-lm-eval``: lm-eval's own command line (``lm_eval --model te_assembly --model_args
pretrained=DIR --tasks ...``) with te_assembly's model registered. lm-eval 0.4 finds models in its own
registry only, with no plugin entry point, so its plain ``lm_eval`` command cannot see ours."""

from __future__ import annotations

import sys


def main() -> None:
    from te_assembly.errors import MissingToolError
    from te_assembly.jobs.harness.run import harness

    try:
        harness()
    except MissingToolError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()


if __name__ == "__main__":
    main()
