"""Named traces (``flatradix.replay.datasets``) and compressed traces.

The packaged sample is the first 500 lines of the Mooncake conversation trace,
byte for byte (checked against ``../shared/traces`` when it is there); a download
is exercised against a local HTTP server started here (never the network): the
file is fetched once, checked, cached, and a bad checksum, a truncated transfer or
an unreachable server leave no file behind and say what to do.
"""

import gzip
import hashlib
import http.server
import json
import os
import pathlib
import threading

import pytest

from flatradix.replay import datasets, load_trace
from flatradix.replay.datasets import NamedTrace, TraceDownloadError

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "traces" / "mooncake_conversation_trace.jsonl"

LINES = "".join(json.dumps({"timestamp": i, "input_length": 600, "output_length": 3,
                            "hash_ids": [0, i + 1]}) + "\n" for i in range(40)).encode()


@pytest.fixture
def server():
    """A local HTTP server over a dict of path -> bytes; counts the requests."""
    files, hits = {}, []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            body = files.get(self.path)
            if body is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", files, hits
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def fake(monkeypatch, tmp_path, server):
    """A named trace served by the local server, cached under tmp_path."""
    base, files, hits = server
    files["/t/trace.jsonl"] = LINES
    t = NamedTrace("test:trace", "a test trace", filename="test_trace.jsonl",
                   sha256=hashlib.sha256(LINES).hexdigest(), size=len(LINES),
                   url=base + "/t/trace.jsonl")
    monkeypatch.setitem(datasets.TRACES, t.name, t)
    monkeypatch.setenv("FLATRADIX_TRACE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("FLATRADIX_TRACE_MIRROR", raising=False)
    return t, files, hits, tmp_path / "cache"


def test_the_sample_is_packaged_and_is_the_traces_first_500_requests():
    w = load_trace("mooncake:sample")
    assert len(w) == 500 and w.name == "mooncake:sample" and w.block_size == 512
    path = datasets.fetch("mooncake:sample")
    raw = gzip.decompress(pathlib.Path(path).read_bytes())
    assert hashlib.sha256(raw).hexdigest() == (
        "7f0f42025c3a7065a7672d854fa88ce778d061ea0a7df327221f05aeda8439dd")
    assert raw.count(b"\n") == 500
    t = datasets.TRACES["mooncake:sample"]
    assert os.path.getsize(path) == t.size
    assert hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest() == t.sha256
    licence = (pathlib.Path(path).parent / "README.md").read_text()
    assert "Apache" in licence and "kvcache-ai/Mooncake" in licence
    if SHARED.exists():
        full = SHARED.read_bytes()
        assert full.startswith(raw)
        assert hashlib.sha256(full).hexdigest() == datasets.TRACES["mooncake:conversation"].sha256
        assert len(full) == datasets.TRACES["mooncake:conversation"].size


def test_a_named_trace_downloads_once_then_reads_the_cache(fake, capsys):
    t, files, hits, cache = fake
    w = load_trace("test:trace")
    assert len(w) == 40 and w.name == "test:trace"
    assert hits == ["/t/trace.jsonl"]
    assert (cache / "test_trace.jsonl").read_bytes() == LINES
    err = capsys.readouterr().err
    assert "downloading test:trace" in err and str(cache) in err
    load_trace("test:trace")
    assert hits == ["/t/trace.jsonl"]              # cached: no second request
    assert [p.name for p in cache.iterdir()] == ["test_trace.jsonl"]   # no .part left


def test_a_bad_checksum_or_truncated_file_leaves_nothing_and_says_what_to_do(fake):
    t, files, hits, cache = fake
    files["/t/trace.jsonl"] = LINES.replace(b'"output_length": 3', b'"output_length": 4')
    with pytest.raises(TraceDownloadError, match="is not the expected file") as e:
        datasets.fetch("test:trace")
    assert t.sha256 in str(e.value) and "yourself" in str(e.value)
    files["/t/trace.jsonl"] = LINES[:100]
    with pytest.raises(TraceDownloadError, match="is not the expected file"):
        datasets.fetch("test:trace")
    assert list(cache.iterdir()) == []
    # a cached file that went bad is fetched again
    files["/t/trace.jsonl"] = LINES
    (cache / "test_trace.jsonl").write_bytes(b"x" * len(LINES))
    assert pathlib.Path(datasets.fetch("test:trace")).read_bytes() == LINES


def test_an_unreachable_server_or_404_is_a_download_error(fake, monkeypatch):
    t, files, hits, cache = fake
    del files["/t/trace.jsonl"]
    with pytest.raises(TraceDownloadError, match="could not download test:trace from http"):
        datasets.fetch("test:trace")
    monkeypatch.setitem(datasets.TRACES, t.name,
                        NamedTrace(t.name, "", t.filename, t.sha256, t.size,
                                   url="http://127.0.0.1:9/nothing"))
    with pytest.raises(OSError, match="could not download"):
        datasets.fetch("test:trace", timeout=5)
    assert list(cache.iterdir()) == []


def test_a_mirror_directory_or_url_replaces_the_public_url(fake, monkeypatch, tmp_path, server):
    t, files, hits, cache = fake
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / "test_trace.jsonl").write_bytes(LINES)
    monkeypatch.setenv("FLATRADIX_TRACE_MIRROR", str(mirror))
    assert pathlib.Path(datasets.fetch("test:trace")).read_bytes() == LINES
    assert hits == []
    (cache / "test_trace.jsonl").unlink()
    base, files, hits = server
    files["/m/test_trace.jsonl"] = LINES
    monkeypatch.setenv("FLATRADIX_TRACE_MIRROR", base + "/m/")
    datasets.fetch("test:trace")
    assert hits == ["/m/test_trace.jsonl"]


def test_the_cli_downloads_and_reports_a_failed_download_in_one_line(fake, capsys):
    from flatradix.cli import main

    t, files, hits, cache = fake
    assert main(["replay", "--trace", "test:trace", "--describe", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["requests"] == 40
    (cache / "test_trace.jsonl").unlink()
    del files["/t/trace.jsonl"]
    assert main(["replay", "--trace", "test:trace"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("flatradix replay: error: --trace: test:trace: could not "
                              "download test:trace"), err


def test_a_file_wins_over_a_name_and_unknown_names_list_the_known(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mooncake:sample").write_bytes(LINES)      # a file of that name
    assert len(load_trace("mooncake:sample")) == 40
    with pytest.raises(FileNotFoundError, match="known: mooncake:sample, mooncake:conversation"):
        load_trace("mooncake:nope")
    with pytest.raises(KeyError):
        datasets.fetch("nope")


@pytest.mark.parametrize("compress", [gzip.compress, __import__("bz2").compress,
                                      __import__("lzma").compress], ids=["gz", "bz2", "xz"])
def test_compressed_traces_read_as_the_plain_file(tmp_path, compress):
    plain = tmp_path / "t.jsonl"
    plain.write_bytes(LINES)
    packed = tmp_path / "t.jsonl.packed"          # told by content, not by name
    packed.write_bytes(compress(LINES))
    a, b = load_trace(plain), load_trace(packed)
    assert len(b) == 40 and b.prompt_tokens == a.prompt_tokens
    assert (a.hash_ids == b.hash_ids).all() and (a.timestamps == b.timestamps).all()


def test_a_truncated_or_corrupt_gzip_is_a_format_error_naming_the_file(tmp_path):
    from flatradix.replay import TraceFormatError

    packed = gzip.compress(LINES * 50, mtime=0)
    cut = tmp_path / "cut.gz"
    cut.write_bytes(packed[:len(packed) // 2])
    with pytest.raises(TraceFormatError, match=r"cut.gz: the gzip data ends early \(truncated"):
        load_trace(cut)
    bad = tmp_path / "bad.gz"
    bad.write_bytes(packed[:20] + b"\x00" * 50 + packed[70:])
    with pytest.raises(TraceFormatError, match="bad.gz: the gzip data"):
        load_trace(bad)
    # a gzipped UTF-16 file is still named as UTF-16
    u16 = tmp_path / "u16.gz"
    u16.write_bytes(gzip.compress(LINES.decode().encode("utf-16")))
    with pytest.raises(TraceFormatError, match="UTF-16"):
        load_trace(u16)
