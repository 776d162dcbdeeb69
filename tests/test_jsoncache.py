"""The small JSON caches: entries by key, the oldest dropped first, fields added to an entry."""

import json

from fly_cpp.basics import jsoncache


def test_update_adds_fields_to_an_entry_and_makes_it_the_newest(tmp_path):
    path = tmp_path / "cache.json"
    jsoncache.store(path, "a", {"x": 1})
    jsoncache.store(path, "b", {"y": 2})
    jsoncache.update(path, "a", {"checked": True})
    data = json.loads(path.read_text())
    assert list(data) == ["b", "a"] and data["a"] == {"x": 1, "checked": True}
    jsoncache.store(path, "c", {}, max_entries=2)  # the oldest ("b") goes, not the one just noted
    assert list(jsoncache.load(path)) == ["a", "c"]


def test_update_of_a_missing_entry_writes_nothing(tmp_path):
    path = tmp_path / "cache.json"
    jsoncache.update(path, "a", {"checked": True})
    assert not path.exists()
    jsoncache.store(path, "b", {"y": 2})
    before = path.stat().st_mtime_ns
    jsoncache.update(path, "a", {"checked": True})
    assert path.stat().st_mtime_ns == before and jsoncache.load(path) == {"b": {"y": 2}}
