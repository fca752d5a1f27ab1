"""cache_tools export / import: round trips, and archives that must be refused without touching the cache."""
from __future__ import annotations

import io
import json
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest

import jitops
from jitops.runtime import runtime

from cache_tools_helpers import GELU_ITEM, cli, cli_json, entry_dirs, snapshot, write_manifest


@pytest.fixture(scope="module")
def source_cache(tmp_path_factory) -> Path:
    """Two NVRTC entries (gelu bf16 and fp32 for sm_80), compiled once for this module."""
    from cache_tools.cli import main

    root = tmp_path_factory.mktemp("source") / "cache"
    manifest = write_manifest(root.parent / "m.json", GELU_ITEM, archs=["sm_80"])
    assert main(["prewarm", "--manifest", str(manifest), "--cache-dir", str(root), "--no-progress"]) == 0
    return root


@pytest.fixture(scope="module")
def archive(source_cache, tmp_path_factory) -> Path:
    from cache_tools.cli import main

    path = tmp_path_factory.mktemp("archive") / "kernels.tar"
    assert main(["export", str(path), "--cache-dir", str(source_cache)]) == 0
    return path


@pytest.fixture
def target(tmp_path, monkeypatch) -> Path:
    """A cache to import into, already holding one entry (so 'nothing lost' means something); import's staging
    directories go to a private temp dir, checked empty afterwards."""
    from cache_tools.cli import main

    root = tmp_path / "target"
    manifest = write_manifest(tmp_path / "m.json", {"op": "add", "dtypes": ["fp16"], "shapes": [[[64], [64]]]},
                              archs=["sm_80"])
    assert main(["prewarm", "--manifest", str(manifest), "--cache-dir", str(root), "--no-progress"]) == 0
    staging = tmp_path / "staging"
    staging.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(staging))
    yield root
    assert list(staging.iterdir()) == []  # import cleaned up after itself


def members(path: Path) -> list[tuple[tarfile.TarInfo, bytes]]:
    with tarfile.open(path) as tar:
        return [(m, tar.extractfile(m).read() if m.isreg() else b"") for m in tar.getmembers()]


def write_tar(path: Path, items: list[tuple[tarfile.TarInfo, bytes]]) -> Path:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in items:
            info = _copy(info)
            if info.isreg():
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    return path


def _copy(info: tarfile.TarInfo) -> tarfile.TarInfo:
    clone = tarfile.TarInfo(info.name)
    for attr in ("size", "mtime", "mode", "type", "linkname", "uid", "gid", "uname", "gname", "devmajor",
                 "devminor"):
        setattr(clone, attr, getattr(info, attr))
    return clone


def regular(name: str, data: bytes = b"x") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def special(name: str, kind: bytes, linkname: str = "") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    return info, b""


def entry_listing(root: Path) -> list[tuple]:
    with jitops.config.scope(cache_dir=root, cache_path=()):
        from cache_tools.entries import list_entries

        return sorted((r["op"], r["label"], r["arch"], r["dtype"], r["shape_class"])
                      for r in list_entries()["entries"])


# ---- round trips ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["kernels.tar", "kernels.tar.gz", "kernels.tar.zst"])
def test_export_then_import_round_trip(name, source_cache, tmp_path, capsys):
    if name.endswith(".zst"):
        pytest.importorskip("zstandard")
    path = tmp_path / name
    code, out, err = cli(capsys, "export", path, "--cache-dir", source_cache)
    assert code == 0 and "2 entries" in out
    destination = tmp_path / "imported"
    code, report = cli_json(capsys, "import", path, "--cache-dir", destination)
    assert code == 0 and len(report["imported"]) == 2 and report["already_present"] == []
    assert entry_listing(destination) == entry_listing(source_cache)
    assert cli(capsys, "verify", "--cache-dir", destination)[0] == 0
    # every imported entry is where the runtime looks for its key
    with jitops.config.scope(cache_dir=destination, cache_path=()):
        for entry in entry_dirs(destination):
            meta = json.loads((entry / "meta.json").read_text())
            key = jitops.keys.CacheKey(meta["request"], meta["toolchain"])
            assert runtime.find_entry(key, any_toolchain=False).path == entry
    code, report = cli_json(capsys, "import", path, "--cache-dir", destination)
    assert code == 0 and report["imported"] == [] and len(report["already_present"]) == 2


def test_export_is_reproducible_and_a_plain_tar_unpacks_into_a_usable_root(source_cache, tmp_path, capsys):
    first, second = tmp_path / "a.tar", tmp_path / "b.tar"
    assert cli(capsys, "export", first, "--cache-dir", source_cache)[0] == 0
    assert cli(capsys, "export", second, "--cache-dir", source_cache)[0] == 0
    assert first.read_bytes() == second.read_bytes()
    names = [m.name for m, _ in members(first)]
    assert names[0] == "jitops-archive.json" and all(n.startswith("v1/") for n in names[1:])
    assert not any(n.endswith("last_used") for n in names)
    unpacked = tmp_path / "unpacked"  # what Docker's ADD kernels.tar /dir/ does
    with tarfile.open(first) as tar:
        tar.extractall(unpacked, filter="data")
    code, report = cli_json(capsys, "verify", "--cache-dir", unpacked)
    assert code == 0 and report["checked"] == 2


def test_export_filters_by_arch_and_leaves_out_corrupt_entries(source_cache, tmp_path, capsys):
    cache = tmp_path / "cache"
    shutil.copytree(source_cache, cache)
    assert cli_json(capsys, "export", tmp_path / "none.tar", "--cache-dir", cache, "--arch", "sm_90a")[1]["entries"] == []
    bad = entry_dirs(cache)[0]
    (bad / "kernel.cubin").write_bytes(b"garbage")
    code, out, err = cli(capsys, "export", tmp_path / "k.tar", "--cache-dir", cache)
    assert code == 0 and "1 entries" in out and f"left out corrupt entry {bad}" in err
    assert not any(bad.name in m.name for m, _ in members(tmp_path / "k.tar"))


def test_zstd_without_the_zstandard_package_is_a_clear_error(source_cache, tmp_path, capsys, monkeypatch):
    pytest.importorskip("zstandard")
    path = tmp_path / "k.tar.zst"
    assert cli(capsys, "export", path, "--cache-dir", source_cache)[0] == 0
    monkeypatch.setitem(sys.modules, "zstandard", None)
    code, out, err = cli(capsys, "export", tmp_path / "again.tar.zst", "--cache-dir", source_cache)
    assert code == 2 and "pip install zstandard" in err and not (tmp_path / "again.tar.zst").exists()
    code, out, err = cli(capsys, "import", path, "--cache-dir", tmp_path / "dest")
    assert code == 2 and "pip install zstandard" in err


# ---- archives that must be refused ---------------------------------------------------------------------------------
def _tampered_bytes(items):
    info, data = next((i, d) for i, d in items if i.name.endswith("kernel.cubin"))
    flipped = bytearray(data)
    flipped[10] ^= 0xFF
    return [(i, bytes(flipped) if i is info else d) for i, d in items]


def _tampered_with_index(items):
    """The binary changed and the index rewritten to match: meta.json's sha256 still catches it."""
    items = _tampered_bytes(items)
    index = json.loads(items[0][1])
    for entry in index["entries"]:
        for info, data in items:
            if info.name.startswith(entry["path"] + "/"):
                import hashlib
                entry["files"][info.name.rsplit("/", 1)[1]] = {"sha256": hashlib.sha256(data).hexdigest(),
                                                              "size": len(data)}
    return [(items[0][0], json.dumps(index).encode())] + items[1:]


def _renamed_entry(items):
    """An entry moved under another key's directory name (index kept consistent)."""
    index = json.loads(items[0][1])
    old = index["entries"][0]["path"]
    new = old[:-8] + "00000000"
    index["entries"][0]["path"] = new
    renamed = [(_renamed(i, old, new), d) for i, d in items[1:]]
    return [(items[0][0], json.dumps(index).encode())] + renamed


def _renamed(info, old, new):
    clone = _copy(info)
    clone.name = info.name.replace(old, new)
    return clone


def _entry_dir(items):
    return next(i.name for i, _ in items if i.name.endswith("/meta.json")).rsplit("/", 1)[0]


REFUSED = {
    "absolute path": (lambda items: items + [regular("/tmp/jitops-evil")], "is an absolute path"),
    "dot-dot": (lambda items: items + [regular("v1/sm_80/../../../evil")], "climbs out with '..'"),
    "dot-dot first": (lambda items: [regular("../evil")] + items, "climbs out with '..'"),
    "symlink": (lambda items: items + [special(_entry_dir(items) + "/link", tarfile.SYMTYPE, "/etc/passwd")],
                "is a symbolic link"),
    "hard link": (lambda items: items + [special(_entry_dir(items) + "/hard", tarfile.LNKTYPE, "/etc/passwd")],
                  "is a hard link"),
    "device file": (lambda items: items + [special(_entry_dir(items) + "/dev", tarfile.CHRTYPE)],
                    "is a device file"),
    "fifo": (lambda items: items + [special(_entry_dir(items) + "/fifo", tarfile.FIFOTYPE)], "is a FIFO"),
    "outside the layout": (lambda items: items + [regular("v1/locks/x.lock")], "is not at a cache entry path"),
    "file too shallow": (lambda items: items + [regular("v1/sm_80/evil.so")], "is not at a cache entry path"),
    "duplicate": (lambda items: items + [items[-1]], "appears twice"),
    "no index": (lambda items: items[1:], "has no jitops-archive.json"),
    "cut at a member boundary": (lambda items: items[:-1], "is truncated: 1 file(s) its index lists are absent"),
    "unlisted file": (lambda items: items + [regular(_entry_dir(items) + "/extra.so")],
                      "holds files its index does not list"),
    "tampered binary": (_tampered_bytes, "does not match its sha256 in the index"),
    "tampered binary and index": (_tampered_with_index, "sha256 does not match meta.json"),
    "entry under another key": (_renamed_entry, "its key in meta.json belongs at"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_import_refuses_unsafe_or_damaged_archives_and_changes_nothing(case, archive, target, tmp_path, capsys):
    change, message = REFUSED[case]
    bad = write_tar(tmp_path / "bad.tar", change(members(archive)))
    before = snapshot(target)
    code, out, err = cli(capsys, "import", bad, "--cache-dir", target)
    assert code == 2, err
    assert "jitops-cache import: error:" in err and message in err and "Nothing was imported" in err, err
    assert snapshot(target) == before
    assert not Path("/tmp/jitops-evil").exists() and not (tmp_path / "evil").exists()


@pytest.mark.parametrize("compression", ["none", "zstd", "gzip"])
def test_import_refuses_a_truncated_archive(compression, archive, target, tmp_path, capsys):
    data = archive.read_bytes()
    if compression == "zstd":
        zstandard = pytest.importorskip("zstandard")
        data = zstandard.ZstdCompressor().compress(data)
    elif compression == "gzip":
        import gzip
        data = gzip.compress(data)
    cut = tmp_path / "cut.tar"
    cut.write_bytes(data[: len(data) * 2 // 3])
    before = snapshot(target)
    code, out, err = cli(capsys, "import", cut, "--cache-dir", target)
    assert code == 2 and ("truncated" in err or "damaged" in err) and "Nothing was imported" in err, err
    assert snapshot(target) == before


@pytest.mark.parametrize("content, message", [
    (None, "not found"),
    (b"", "is an empty file"),
    (b"this is not an archive at all" * 40, "truncated or damaged"),
    (b"\x28\xb5\x2f\xfd" + b"\x00" * 64, "truncated or damaged"),
])
def test_import_refuses_files_that_are_not_archives(content, message, target, tmp_path, capsys):
    if content and content.startswith(b"\x28\xb5"):
        pytest.importorskip("zstandard")
    path = tmp_path / "input.tar"
    if content is not None:
        path.write_bytes(content)
    before = snapshot(target)
    code, out, err = cli(capsys, "import", path, "--cache-dir", target)
    assert code == 2 and message in err, err
    assert snapshot(target) == before


def test_import_replaces_a_corrupt_copy_of_the_same_entry(archive, source_cache, tmp_path, capsys):
    destination = tmp_path / "dest"
    assert cli(capsys, "import", archive, "--cache-dir", destination)[0] == 0
    broken = entry_dirs(destination)[0]
    (broken / "kernel.cubin").write_bytes(b"rotten")
    code, report = cli_json(capsys, "import", archive, "--cache-dir", destination)
    assert code == 0 and [r.get("replaced_corrupt") for r in report["imported"]] == [True]
    assert len(report["already_present"]) == 1
    assert cli(capsys, "verify", "--cache-dir", destination)[0] == 0


def test_cache_dir_that_is_a_file_is_bad_input(archive, tmp_path, capsys):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    code, out, err = cli(capsys, "import", archive, "--cache-dir", not_a_dir)
    assert code == 2 and "is a file; give a directory" in err and not_a_dir.read_text() == "x"


def test_export_to_a_directory_fails_cleanly_and_leaves_nothing_behind(source_cache, tmp_path, capsys):
    occupied = tmp_path / "out.tar"
    occupied.mkdir()
    code, out, err = cli(capsys, "export", occupied, "--cache-dir", source_cache)
    assert code == 2 and "jitops-cache export: error:" in err and "is a directory" in err and "Traceback" not in err
    assert [p.name for p in tmp_path.iterdir()] == ["out.tar"] and list(occupied.iterdir()) == []
