"""The README's API example runs exactly as written."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_starts_with_the_two_commands():
    text = README.read_text()
    first_block = re.search(r"```bash\n(.*?)```", text, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in first_block.strip().splitlines()]
    assert commands == ["make demo", "make test"]


def test_readme_python_example_runs_as_written(capsys):
    block = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    assert len(block.strip().splitlines()) <= 10
    namespace: dict = {}
    exec(compile(block, str(README), "exec"), namespace)
    result = namespace["result"]
    assert namespace["mean"].shape == (5,) and bool((namespace["var"] > 0).all())
    assert len(result.history) == 50
    # the example is also a sanity check: 50 rounds bring the test RMSE close to the noise level
    assert result.history["test_rmse_mean"].iloc[-1] < result.history["test_rmse_mean"].iloc[0]
