"""Owner tables from CSV files (``fedgp.data.table``): what is read back, and what is refused where."""

import re
import string
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fedgp.data.table import CLI_ROLES, RUN_CONFIG_ROLES, read_owner_table, rows_by_owner
from fedgp.errors import TableError

# Labels pandas would read as missing (its default NA strings) are not owner names.
NA_TEXT = {
    "",
    "NA",
    "N/A",
    "NaN",
    "nan",
    "NULL",
    "null",
    "None",
    "n/a",
    "<NA>",
    "#N/A",
    "-NaN",
    "-nan",
    "NAN",
}
labels = st.text(string.ascii_letters + string.digits + " _-", min_size=1, max_size=6).filter(
    lambda s: s.strip() == s and s not in NA_TEXT and not s.startswith("#N/A")
)
finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
# Cells that are not numbers to pandas or Python (a decimal comma, words, units, two dots).
NOT_NUMBERS = ["4,7", "abc", "12 kg", "1.2.3", "--", "x1", "yes"]


def _write(frame: pd.DataFrame) -> tuple[tempfile.TemporaryDirectory, Path]:
    tmp = tempfile.TemporaryDirectory()
    path = Path(tmp.name) / "owners.csv"
    frame.to_csv(path, index=False)
    return tmp, path


@st.composite
def tables(draw):
    n = draw(st.integers(1, 12))
    d = draw(st.integers(1, 3))
    owners = draw(
        st.lists(st.sampled_from(draw(st.lists(labels, min_size=1, max_size=4))), min_size=n, max_size=n)
    )
    X = np.array(draw(st.lists(st.lists(finite, min_size=d, max_size=d), min_size=n, max_size=n)))
    y = np.array(draw(st.lists(finite, min_size=n, max_size=n)))
    frame = pd.DataFrame(X, columns=[f"f{j}" for j in range(d)])
    frame.insert(draw(st.integers(0, d)), "owner", owners)
    frame["target"] = y
    return frame


@given(tables())
def test_a_written_table_reads_back_exactly(frame):
    """Every finite float64 round-trips, owner labels stay text (in order of first appearance), and
    the features default to the columns that are neither target nor owner, in the file's order."""
    tmp, path = _write(frame)
    with tmp:
        table = read_owner_table(path, group="owner", target="target")
    features = [c for c in frame.columns if c not in ("owner", "target")]
    assert table.features == tuple(features)
    np.testing.assert_array_equal(table.X, frame[features].to_numpy(dtype=float))
    np.testing.assert_array_equal(table.y, frame["target"].to_numpy(dtype=float))
    assert table.owners.tolist() == frame["owner"].tolist()
    assert table.lines.tolist() == list(range(2, len(frame) + 2))
    groups = table.rows()
    assert list(groups) == list(dict.fromkeys(frame["owner"]))
    for owner, rows in groups.items():
        assert (frame["owner"].to_numpy()[rows] == owner).all()


@given(tables(), st.data())
def test_one_bad_cell_is_named_by_column_line_and_owner(frame, data):
    numeric = [c for c in frame.columns if c != "owner"]
    row = data.draw(st.integers(0, len(frame) - 1))
    column = data.draw(st.sampled_from(numeric))
    kind = data.draw(st.sampled_from(["text", "empty", "inf"]))
    bad = frame.astype({column: object})
    bad.loc[row, column] = {"text": data.draw(st.sampled_from(NOT_NUMBERS)), "empty": None, "inf": "-inf"}[
        kind
    ]
    tmp, path = _write(bad)
    with tmp, pytest.raises(TableError) as caught:
        read_owner_table(path, group="owner", target="target")
    message = str(caught.value)
    # the first bad cell in the order the columns are checked (features, then the target) is this one
    assert message.startswith(f"{path}: column {column!r}, line {row + 2} (owner {frame['owner'][row]!r}): ")
    assert {"text": "is not a number", "empty": "missing value", "inf": "is not a finite number"}[
        kind
    ] in message


@given(tables(), st.sampled_from(["target", "owner", "f0"]))
def test_a_missing_column_is_named_with_the_columns_there(frame, dropped):
    tmp, path = _write(frame.drop(columns=dropped))
    with tmp, pytest.raises(TableError, match=rf"no column '{dropped}'") as caught:
        read_owner_table(path, group="owner", target="target", features=["f0"])
    assert str(caught.value).startswith(f"{path}: ")


def test_blank_lines_are_skipped_and_lines_still_count(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("x,owner,y\n1,a,2\n\n2,a,x\n")
    with pytest.raises(TableError, match=r"column 'y', line 4 \(owner 'a'\): 'x' is not a number"):
        read_owner_table(path, group="owner", target="y")


def test_federation_needs_two_rows_per_owner_and_three_with_a_test_split(tmp_path):
    frame = pd.DataFrame(
        {"x": [0.0, 1.0, 2.0, 3.0, 4.0], "owner": ["a", "a", "b", "b", "b"], "y": [1.0, 2, 3, 4, 6]}
    )
    frame.to_csv(tmp_path / "t.csv", index=False)
    table = read_owner_table(tmp_path / "t.csv", group="owner", target="y")
    assert [c.n for c in table.federation()] == [2, 3]
    with pytest.raises(
        TableError, match=re.escape("owner 'a' has 2 row(s) (line 2, line 3); training needs at least 3")
    ):
        table.federation(test_fraction=0.3)
    fed = read_owner_table(tmp_path / "t.csv", group="owner", target="y").federation()
    np.testing.assert_array_equal(fed[1].X.numpy().ravel(), [2.0, 3.0, 4.0])


def test_rows_by_owner_keeps_first_appearance_and_python_labels():
    groups = rows_by_owner(np.array([3, 1, 3, 2, 1]))
    assert list(groups) == [3, 1, 2] and all(type(k) is int for k in groups)
    assert [g.tolist() for g in groups.values()] == [[0, 2], [1, 4], [3]]
    with pytest.raises(ValueError, match="row 1 has no owner label"):
        rows_by_owner(["a", None, "b"])


# -- issue 49: separators, and messages in the words of the caller's door --------------------------


def _plants(folder: Path) -> pd.DataFrame:
    frame = pd.DataFrame(
        {"era": ["old", "old", "new", "new", "new"], "weight": [1.5, 2.25, 3.0, -4.0, 5.5],
         "mpg": [10.0, 12.5, 14.0, 9.75, 11.0]}
    )  # fmt: skip
    frame.to_csv(folder / "comma.csv", index=False)
    return frame


@pytest.mark.parametrize(
    "name, sep", [("tabs.tsv", "\t"), ("tabs.csv", "\t"), ("semicolons.csv", ";"), ("tabs.txt", "\t")]
)
def test_a_tab_or_semicolon_separated_file_reads_as_its_comma_twin(tmp_path, name, sep):
    """The header line decides: no comma and a tab (or ``;``) that splits it, or a ``.tsv`` name."""
    frame = _plants(tmp_path)
    frame.to_csv(tmp_path / name, sep=sep, index=False)
    comma = read_owner_table(tmp_path / "comma.csv", group="era", target="mpg")
    table = read_owner_table(tmp_path / name, group="era", target="mpg")
    assert table.features == comma.features == ("weight",)
    np.testing.assert_array_equal(table.X, comma.X)
    np.testing.assert_array_equal(table.y, comma.y)
    assert table.owners.tolist() == comma.owners.tolist()


def test_a_comma_separated_file_stays_comma_separated(tmp_path):
    """A comma in the header wins, whatever else the header holds (a ``;`` or a tab in a name)."""
    path = tmp_path / "odd.csv"
    path.write_text("era,w;kg,mpg\ta\nold,1,2\nold,3,4\n")
    table = read_owner_table(path, group="era", target="mpg\ta")
    assert table.features == ("w;kg",) and table.y.tolist() == [2.0, 4.0]


def test_a_missing_column_says_which_separator_the_file_was_read_with(tmp_path):
    _plants(tmp_path).to_csv(tmp_path / "semi.csv", sep=";", index=False)
    with pytest.raises(TableError) as caught:
        read_owner_table(tmp_path / "semi.csv", group="owner", target="mpg")
    assert str(caught.value) == (
        f"{tmp_path / 'semi.csv'}: no column 'owner' (group=); its columns are 'era', 'weight', 'mpg', "
        "read as semicolon-separated"
    )


@pytest.mark.parametrize(
    "roles, group, features",
    [
        (None, "group=", "features=[...]"),
        (CLI_ROLES, "--group", "--features"),
        (RUN_CONFIG_ROLES, "run config 'group'", "run config 'features'"),
    ],
)
def test_messages_name_the_roles_as_the_callers_door_does(tmp_path, roles, group, features):
    """The CLI's flags, the Flower app's run-config keys, Python's argument names; a text column
    read as a feature by default says how to choose the features."""
    frame = _plants(tmp_path).assign(site=["north", "south", "north", "east", "west"])
    frame.to_csv(tmp_path / "t.csv", index=False)
    with pytest.raises(TableError, match=re.escape(f"no column 'owner' ({group})")):
        read_owner_table(tmp_path / "t.csv", group="owner", target="mpg", roles=roles)
    with pytest.raises(TableError) as caught:
        read_owner_table(tmp_path / "t.csv", group="era", target="mpg", roles=roles)
    assert str(caught.value) == (
        f"{tmp_path / 't.csv'}: column 'site', line 2 (era 'old'): 'north' is not a number; a feature must "
        f"be a number: choose the feature columns with {features} (by default every column but the owner "
        "and target columns is one)"
    )
    with pytest.raises(TableError, match=re.escape(f"'north' is not a number; every feature ({features})")):
        read_owner_table(
            tmp_path / "t.csv", group="era", target="mpg", features=["weight", "site"], roles=roles
        )
    table = read_owner_table(tmp_path / "t.csv", group="era", target="mpg", features=["weight"], roles=roles)
    assert table.features == ("weight",)


def _dated(tmp_path: Path, kind: str) -> Path:
    """A Parquet owner table whose column 'when' holds dates (``kind``), written with pyarrow."""
    import datetime

    import pyarrow as pa
    import pyarrow.parquet as pq

    days = [datetime.date(2024, 1, d) for d in (5, 6, 7, 8)]
    when = {
        "datetime": pa.array(pd.to_datetime(days)),  # pandas datetime64 (a Parquet timestamp)
        "date": pa.array(days, type=pa.date32()),  # read back as an object column of datetime.date
        "timedelta": pa.array(pd.to_timedelta([1, 2, 3, 4], unit="D")),  # a Parquet duration
    }[kind]
    path = tmp_path / f"{kind}.parquet"
    table = {
        "owner": ["a", "a", "b", "b"],
        "x": [1.0, 2.0, 3.0, 4.0],
        "when": when,
        "y": [1.0, 3.0, 2.0, 5.0],
    }
    pq.write_table(pa.table(table), path)
    return path


PARQUET_DATES = {  # kind: the refused cell of line 2, what it is, and how to make it a number
    "datetime": ("'2024-01-05 00:00:00' is a date and time", "days or seconds since a reference date"),
    "date": ("'2024-01-05' is a date", "the number of days since a reference date"),
    "timedelta": ("'1 days 00:00:00' is a duration", "a number of days or seconds"),
}


@pytest.mark.parametrize("kind", sorted(PARQUET_DATES))
def test_a_parquet_date_column_is_refused_as_a_csv_date_is(tmp_path, kind):
    """Issue 51: Parquet dates, times and durations were read as numbers (microseconds since 1970),
    where the CSV reader refuses a date as not a number; now they are refused, by file, column, line
    and owner, saying how to convert them."""
    path = _dated(tmp_path, kind)
    cell, how = PARQUET_DATES[kind]
    for features in (None, ["x", "when"]):  # every column by default, or named
        with pytest.raises(TableError) as caught:
            read_owner_table(path, group="owner", target="y", features=features)
        assert str(caught.value).startswith(
            f"{path}: column 'when', line 2 (owner 'a'): {cell}, not a number; convert the column to "
            f"numbers first (e.g. {how})"
        )
    with pytest.raises(
        TableError, match=re.escape(f"column 'when', line 2 (owner 'a'): {cell}, not a number")
    ):
        read_owner_table(path, group="owner", target="when", features=["x"])  # as the target too
    table = read_owner_table(path, group="owner", target="y", features=["x"])  # left out: read
    assert table.X.ravel().tolist() == [1.0, 2.0, 3.0, 4.0]


def test_a_numeric_parquet_table_reads_as_its_csv_twin(tmp_path):
    frame = pd.DataFrame(
        {
            "owner": ["a", "a", "7", "7"],
            "x": [0.1, 2.0, -3.5, 4.0],
            "n": [1, 2, 3, 4],
            "y": [1.0, 3.0, 2.0, 5.0],
        }
    )
    frame.to_csv(tmp_path / "t.csv", index=False)
    frame.to_parquet(tmp_path / "t.parquet")
    a = read_owner_table(tmp_path / "t.csv", group="owner", target="y")
    b = read_owner_table(tmp_path / "t.parquet", group="owner", target="y")
    assert a.features == b.features == ("x", "n")
    assert np.array_equal(a.X, b.X) and np.array_equal(a.y, b.y)
    assert a.owners.tolist() == b.owners.tolist() == ["a", "a", "7", "7"]


def test_a_parquet_date_column_without_dates_is_missing_not_a_number(tmp_path):
    """A datetime column whose every cell is empty (NaT) is a missing value, not -9.2e18."""
    frame = pd.DataFrame({"owner": ["a", "a"], "when": pd.to_datetime([None, None]), "y": [1.0, 2.0]})
    frame.to_parquet(tmp_path / "t.parquet")
    with pytest.raises(TableError, match=re.escape("column 'when', line 2 (owner 'a'): missing value")):
        read_owner_table(tmp_path / "t.parquet", group="owner", target="y")
