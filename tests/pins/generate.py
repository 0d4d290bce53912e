"""Write ``reference.json``: the numbers the round-protocol refactor must not move (issue 13, item 10).

Run once at the commit *before* a refactor (``python -m tests.pins.generate``, with ``FEDGP_DATA`` set
for Table 2); ``test_pins.py`` then holds every later commit to them at 1e-10. Regenerate only with a
written reason in ``results/README.md``.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from tests.pins import cases

HERE = Path(__file__).resolve().parent


def main() -> None:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout
    out = {"commit": commit.strip()}
    for name, case in cases.CASES.items():
        print(f"pinning {name} ...", flush=True)
        out[name] = case()
    (HERE / "reference.json").write_text(json.dumps(out, indent=1) + "\n")
    print(re.sub(r"\s+", " ", json.dumps({k: len(v) if isinstance(v, dict) else v for k, v in out.items()})))


if __name__ == "__main__":
    main()
