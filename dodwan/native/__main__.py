"""``python -m dodwan.native build|status``: compile the core, or say which core runs."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from dodwan import native


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["build"]:
        try:
            native.build()
        except RuntimeError as e:
            print(f"dodwan.native: {e}", file=sys.stderr)
            return 1
        modules, why = native.status()
        print(f"dodwan.native: {why}")
        return 0 if modules is not None else 1
    if args == ["status"]:
        print(native.describe())
        return 0
    print("usage: python -m dodwan.native build|status", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
