"""The key ring: keys created, listed, activated; data keys wrapped and unwrapped; a
missing or wrong key is ``KeyUnavailable`` naming its id; key material appears in no
printout or error; files are private and written whole."""

from __future__ import annotations

import os
import stat

import pytest

from slts.errors import InvalidArgument, InvalidConfig, KeyUnavailable
from slts.transforms.keys import KEY_BYTES, DataKey, FolderKeyRing, WrappedKey


@pytest.fixture
def ring(tmp_path) -> FolderKeyRing:
    ring = FolderKeyRing.create(str(tmp_path / "keys"))
    ring.activate(ring.add("first"))
    return ring


def test_a_data_key_round_trips_through_the_active_key(ring: FolderKeyRing) -> None:
    key = DataKey.generate()
    wrapped = ring.wrap(key)
    assert wrapped.key_id == "first" and len(wrapped.blob) == KEY_BYTES + 8
    assert key.material not in wrapped.blob
    assert ring.unwrap(wrapped) == key
    assert WrappedKey.from_list(wrapped.to_list()) == wrapped


def test_rotation_wraps_new_keys_with_the_new_key_and_keeps_old_ones_readable(ring: FolderKeyRing) -> None:
    old = ring.wrap(key := DataKey.generate())
    ring.activate(ring.add("second"))
    assert ring.active_id() == "second" and ring.ids() == ["first", "second"]
    assert ring.wrap(DataKey.generate()).key_id == "second"
    assert ring.unwrap(old) == key
    rewrapped = ring.wrap(ring.unwrap(old))
    assert rewrapped.key_id == "second" and ring.unwrap(rewrapped) == key


def test_a_ring_opened_again_reads_the_same_keys(ring: FolderKeyRing) -> None:
    wrapped = ring.wrap(key := DataKey.generate())
    again = FolderKeyRing(ring.folder)
    assert again.active_id() == "first" and again.unwrap(wrapped) == key


def test_a_missing_key_names_its_id_and_changes_nothing(ring: FolderKeyRing, tmp_path) -> None:
    wrapped = ring.wrap(DataKey.generate())
    other = FolderKeyRing.create(str(tmp_path / "other"))
    other.activate(other.add("else"))
    with pytest.raises(KeyUnavailable, match="no key 'first'") as caught:
        other.unwrap(wrapped)
    assert caught.value.key_id == "first"
    with pytest.raises(KeyUnavailable):
        ring.activate("nope")
    assert ring.active_id() == "first"


def test_a_wrong_key_under_the_right_id_is_key_unavailable(ring: FolderKeyRing, tmp_path) -> None:
    wrapped = ring.wrap(DataKey.generate())
    impostor = FolderKeyRing.create(str(tmp_path / "impostor"))
    impostor.add("first")  # the same id, another key
    with pytest.raises(KeyUnavailable, match="not the key that wrapped") as caught:
        impostor.unwrap(wrapped)
    assert caught.value.key_id == "first"


def test_key_material_appears_in_no_printout_or_error(ring: FolderKeyRing, tmp_path) -> None:
    key = DataKey.generate()
    kek_path = os.path.join(ring.folder, "first.key")
    with open(kek_path, "rb") as file:
        kek = file.read()
    texts = [repr(key), str(key), repr(ring), repr(ring.wrap(key))]
    impostor = FolderKeyRing.create(str(tmp_path / "impostor"))
    impostor.add("first")
    try:
        impostor.unwrap(ring.wrap(key))
    except KeyUnavailable as exc:
        texts += [str(exc), repr(exc), repr(exc.context)]
    for text in texts:
        for secret in (key.material, kek):
            assert secret.hex() not in text and repr(secret)[2:-1] not in text, text


def test_key_files_and_folder_are_private_and_others_are_refused(ring: FolderKeyRing) -> None:
    assert stat.S_IMODE(os.stat(ring.folder).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(os.path.join(ring.folder, "first.key")).st_mode) == 0o600
    assert not [name for name in os.listdir(ring.folder) if name.endswith(".tmp")], "no temporary file left"
    os.chmod(os.path.join(ring.folder, "first.key"), 0o644)
    with pytest.raises(InvalidConfig, match="can be read by others"):
        FolderKeyRing(ring.folder).wrap(DataKey.generate())
    os.chmod(ring.folder, 0o755)
    with pytest.raises(InvalidConfig, match="can be read by others"):
        FolderKeyRing(ring.folder)


@pytest.mark.parametrize("bad", ["", ".hidden", "-dash", "a/b", "x" * 65, 7])
def test_bad_key_ids_are_refused_and_nothing_is_written(ring: FolderKeyRing, bad: object) -> None:
    before = sorted(os.listdir(ring.folder))
    with pytest.raises(InvalidArgument):
        ring.add(bad)  # type: ignore[arg-type]
    assert sorted(os.listdir(ring.folder)) == before


def test_a_taken_id_is_refused_and_the_key_is_kept(ring: FolderKeyRing) -> None:
    wrapped = ring.wrap(key := DataKey.generate())
    with pytest.raises(InvalidArgument, match="already"):
        ring.add("first")
    assert ring.unwrap(wrapped) == key


def test_rings_that_do_not_exist_or_have_no_active_key_are_invalid_config(tmp_path) -> None:
    with pytest.raises(InvalidConfig, match="does not exist"):
        FolderKeyRing(str(tmp_path / "missing"))
    empty = FolderKeyRing.create(str(tmp_path / "empty"))
    with pytest.raises(InvalidConfig, match="no active key"):
        empty.wrap(DataKey.generate())
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "something").write_text("x")
    with pytest.raises(InvalidConfig, match="not empty"):
        FolderKeyRing.create(str(tmp_path / "full"))


@pytest.mark.parametrize("bad", [b"short", "text", None])
def test_bad_data_keys_and_wrapped_keys_are_refused(bad: object) -> None:
    with pytest.raises(InvalidArgument):
        DataKey(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        WrappedKey("k", bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        WrappedKey.from_list(bad)


def test_a_memory_key_ring_wraps_and_refuses_alike() -> None:
    from slts.transforms.keys import MemoryKeyRing

    ring = MemoryKeyRing()
    with pytest.raises(InvalidConfig):
        ring.wrap(DataKey.generate())
    ring.activate(ring.add("m1"))
    wrapped = ring.wrap(key := DataKey.generate())
    assert wrapped.key_id == "m1" and ring.unwrap(wrapped) == key
    with pytest.raises(InvalidArgument):
        ring.add("m1")
    with pytest.raises(KeyUnavailable) as caught:
        MemoryKeyRing().unwrap(wrapped)
    assert caught.value.key_id == "m1" and "m1" in repr(ring)
