import pandas as pd

from fedgp.cli import main


def test_demo_writes_png_and_tables(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path), "--rounds", "3", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "Personalisation" in out and "centralised MLE" in out
    assert (tmp_path / "demo.png").stat().st_size > 10_000
    table = pd.read_csv(tmp_path / "personalisation.csv")
    assert list(table["client"]) == ["sin", "-sin"]
    assert len(pd.read_csv(tmp_path / "convergence_curve.csv")) == 3
