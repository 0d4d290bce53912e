"""Authenticity as a choice: ``key=`` seals saved models and checkpoints with an HMAC-SHA256; and
temporary files of killed writes are removed by the next write to the same destination."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load as load_payload
from safetensors.torch import save as save_payload

import fedgp
from fedgp.errors import CheckpointError, FileFormatError, InputError, InputTypeError
from fedgp.files import open_temporary, remove_stale_temporaries, write_atomically
from fedgp.messages.container import HEADER, seal, unseal
from fedgp.run.checkpoint import load_checkpoint
from fedgp.strategies import FGPR

KEY = b"a secret shared by the owners"


@pytest.fixture(scope="module")
def draws():
    return fedgp.synthetic.gp_federation(num_clients=3, n=12, d=1, seed=1)


def _fit(draws, rounds, callbacks=()):
    return fedgp.fit(
        draws.spec, draws.federation, FGPR(local_steps=1), engine="sequential", rounds=rounds,
        callbacks=list(callbacks),
    )  # fmt: skip


@pytest.fixture(scope="module")
def result(draws):
    return _fit(draws, 2)


def _double_the_state(src, dst, key=None):
    """A forgery: the server state's values doubled, sealed again (with ``key``, or a plain sha256)."""
    tensors = load_payload(
        unseal(src.read_bytes(), str(src), KEY if src.read_bytes().startswith(b"FEDGP h") else None)
    )
    header = tensors.pop(HEADER)
    own = {
        k: (2 * v if v.is_floating_point() and k[0].isdigit() else v).contiguous() for k, v in tensors.items()
    }
    own[HEADER] = header
    dst.write_bytes(seal(save_payload(own), key))
    return dst


def test_a_model_saved_with_a_key_loads_with_it_and_only_with_it(result, draws, tmp_path):
    path = result.save(tmp_path / "m.fgp", key=KEY)
    assert path.read_bytes().startswith(b"FEDGP hmac-sha256=")
    loaded = fedgp.load(path, key=KEY)
    client = draws.federation[0]
    assert torch.equal(loaded.predict(client.X, client)[0], result.predict(client.X, client)[0])
    assert fedgp.load(result.save(tmp_path / "s.fgp", key=KEY.decode()), key=KEY).state.allclose(result.state)
    with pytest.raises(FileFormatError, match=f"{path} was written with a key .* pass the same key="):
        fedgp.load(path)
    with pytest.raises(FileFormatError, match="HMAC-SHA256 does not match under this key"):
        fedgp.load(path, key=b"another key")
    plain = result.save(tmp_path / "p.fgp")
    with pytest.raises(FileFormatError, match="was written without a key .* but key= was given"):
        fedgp.load(plain, key=KEY)


def test_a_forgery_passes_a_checksum_but_not_a_key(result, draws, tmp_path):
    forged = _double_the_state(result.save(tmp_path / "m.fgp"), tmp_path / "f.fgp")
    # Without a key a crafted file with a matching checksum loads, and changes the model (documented).
    assert not fedgp.load(forged).state.allclose(result.state)
    keyed = result.save(tmp_path / "k.fgp", key=KEY)
    for key in (None, b"the forger's own key"):
        _double_the_state(keyed, tmp_path / "kf.fgp", key)
        with pytest.raises(FileFormatError, match="kf.fgp"):
            fedgp.load(tmp_path / "kf.fgp", key=KEY)


@pytest.mark.parametrize("key, error", [(b"", InputError), ("", InputError), (123, InputTypeError)])
def test_a_malformed_key_is_the_callers_error(result, tmp_path, key, error):
    with pytest.raises(error, match="key="):
        result.save(tmp_path / "m.fgp", key=key)
    with pytest.raises(error, match="key="):
        fedgp.run.Checkpointing(tmp_path / "c.ckpt", key=key)


def test_a_keyed_checkpoint_resumes_with_its_key_and_refuses_a_forgery(draws, tmp_path):
    path = tmp_path / "run.ckpt"
    unbroken = _fit(draws, 3)
    _fit(draws, 2, [fedgp.run.Checkpointing(path, key=KEY)])
    assert (
        path.read_bytes().startswith(b"FEDGP hmac-sha256=")
        and load_checkpoint(path, KEY).completed_rounds == 2
    )
    assert "secret" not in repr(fedgp.run.Checkpointing(path, key=KEY))
    with pytest.raises(CheckpointError, match="was written with a key"):
        _fit(draws, 3, [fedgp.run.Checkpointing(path, resume=True)])
    with pytest.raises(CheckpointError, match="does not match under this key"):
        _fit(draws, 3, [fedgp.run.Checkpointing(path, resume=True, key=b"wrong")])
    resumed = _fit(draws, 3, [fedgp.run.Checkpointing(path, resume=True, key=KEY)])
    assert resumed.state.allclose(unbroken.state, rtol=0, atol=0)
    _double_the_state(path, tmp_path / "forged.ckpt")
    with pytest.raises(CheckpointError, match="was written without a key"):
        _fit(draws, 3, [fedgp.run.Checkpointing(tmp_path / "forged.ckpt", resume=True, key=KEY)])


def test_without_a_key_a_forged_checkpoint_changes_a_resumed_run(draws, tmp_path):
    """What docs/guarantees.md says remains possible without a key."""
    path = tmp_path / "run.ckpt"
    _fit(draws, 2, [fedgp.run.Checkpointing(path)])
    honest = _fit(draws, 3, [fedgp.run.Checkpointing(path, resume=True, every=None)])
    _double_the_state(path, path)
    forged = _fit(draws, 3, [fedgp.run.Checkpointing(path, resume=True, every=None)])
    assert not forged.state.allclose(honest.state)


# -- temporary files of killed writes ------------------------------------------------------------
def _dead_pid() -> int:
    return int(
        subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True).stdout
    )


def _temporary(folder, name, pid=None, age=0.0, suffix=".tmp"):
    handle, path = open_temporary(folder, name, suffix)
    handle.close()
    if pid is not None:
        path = path.rename(path.with_name(path.name.replace(f"-{os.getpid()}.", f"-{pid}.")))
    os.utime(path, (time.time() - age, time.time() - age))
    return path


def test_a_killed_writes_temporary_file_is_removed_by_the_next_write(tmp_path):
    code = (
        "import os, sys; from pathlib import Path; from fedgp.files import open_temporary\n"
        "h, p = open_temporary(Path(sys.argv[1]), 'run.ckpt'); h.write(b'half'); h.flush(); os._exit(9)"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=False, cwd=os.getcwd())
    (killed,) = tmp_path.glob(".run.ckpt.*.tmp")
    live = _temporary(tmp_path, "run.ckpt")  # a writer still running (this process)
    old_style = tmp_path / ".run.ckpt.0123456789ab.tmp"
    old_style.write_bytes(b"x")
    fresh_old_style = tmp_path / ".run.ckpt.ba9876543210.tmp"
    fresh_old_style.write_bytes(b"x")
    os.utime(old_style, (time.time() - 3600, time.time() - 3600))
    other = _temporary(tmp_path, "run.ckpt.bak", pid=_dead_pid())  # another destination's
    lookalike = tmp_path / ".run.ckpt.notes.tmp"  # not a name fedgp makes
    lookalike.write_bytes(b"x")
    os.utime(lookalike, (time.time() - 3600, time.time() - 3600))
    write_atomically(tmp_path / "run.ckpt", b"new")
    assert (tmp_path / "run.ckpt").read_bytes() == b"new"
    assert not killed.exists() and not old_style.exists()
    assert live.exists() and fresh_old_style.exists() and other.exists() and lookalike.exists()


def test_stale_temporaries_leave_links_and_folders_alone(tmp_path):
    target = tmp_path / "keep"
    target.write_bytes(b"x")
    link = tmp_path / f".run.ckpt.{'0' * 8}-{_dead_pid()}.{'a' * 12}.tmp"
    link.symlink_to(target)
    folder = tmp_path / ".run.ckpt.0123456789ab.tmp"
    folder.mkdir()
    os.utime(folder, (0, 0))
    assert remove_stale_temporaries(tmp_path, "run.ckpt", max_age=0.0) == []
    assert link.is_symlink() and folder.is_dir() and target.exists()


def test_a_checkpoint_write_removes_what_a_killed_run_left(draws, tmp_path):
    path = tmp_path / "run.ckpt"
    leftovers = [_temporary(tmp_path, "run.ckpt", pid=_dead_pid()) for _ in range(3)]
    _fit(draws, 1, [fedgp.run.Checkpointing(path)])
    assert not any(p.exists() for p in leftovers)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.ckpt"]
